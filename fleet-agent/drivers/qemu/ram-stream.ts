// Splits a QEMU 7.2 migration stream in two: guest RAM pages go into a RAM file, everything else (device state, the
// RAM section's framing, the firmware's small RAM blocks) into the state file. What comes out is what a VM with a
// shared RAM file and `x-ignore-shared` would have written, so it restores like any file-backed snapshot.
//
// Why: a template's clone maps the template's RAM privately (`share=off`), so QEMU streams all of it (tens of MB)
// into a snapshot. Here the clone's RAM file starts as a copy of the template's (a reflink where the filesystem can:
// no space used), and only the pages that differ from it are written into it: a sleeping clone costs what it changed.
//
// The format (migration/savevm.c and ram.c of QEMU 7.2), as far as it is read here:
// - the stream opens with the magic and version, then a configuration section: passed through as they are, up to the
//   RAM section's start, recognised by its header: QEMU_VM_SECTION_START, section id (be32), idstr "ram" (length
//   byte + bytes), instance id 0 and version 4 (be32 each);
// - RAM records are a be64 of page address | flags; flags (low 12 bits, 4 KiB target pages): MEM_SIZE 0x04 (the
//   setup: total size, then per block its idstr, be64 length, and, with x-ignore-shared, be64 guest address), ZERO
//   0x02 (one fill byte follows), PAGE 0x08 (4096 bytes follow), EOS 0x10 (end of this part), CONTINUE 0x20 (same
//   block as the record before; else a length byte and the block's idstr follow the header);
// - a RAM part is QEMU_VM_SECTION_PART (0x02) or _END (0x03) + section id, records, EOS, and a section footer
//   (0x7e + section id); after the RAM section's END the rest (the devices' full sections) is passed through.
// Anything else in a RAM section (compression, XBZRLE, multifd) is refused: the snapshot then fails and the VM runs on.

import { readSync, writeSync } from "node:fs";

const PAGE = 4096;
const ZERO_PAGE = Buffer.alloc(PAGE);
const FLAG_ZERO = 0x02;
const FLAG_MEM_SIZE = 0x04;
const FLAG_PAGE = 0x08;
const FLAG_EOS = 0x10;
const FLAG_CONTINUE = 0x20;
const SECTION_PART = 0x02;
const SECTION_END = 0x03;
const SECTION_START = 0x01;
const SECTION_FOOTER = 0x7e;
const RAM_START_TAIL = Buffer.from([0x03, 0x72, 0x61, 0x6d, 0, 0, 0, 0, 0, 0, 0, 4]); // "\x03ram", instance 0, version 4

export interface RamPageSink {
  /** A page of the guest RAM block at `offset`: its 4096 bytes, or `fill` for a page of one repeated byte. */
  page(offset: number, data: Buffer | undefined, fill: number): void;
}

type Phase = "pre" | "setup" | "sections" | "records" | "footer" | "rest";

/**
 * A push parser: `push` chunks as they come (any sizes), `end` at the end of the stream. `out` gets the bytes to
 * keep, in order; `sink` the pages of the RAM block named `ramBlock` (the memory backend's id, `mem`).
 */
export class RamStreamSplitter {
  private buf: Buffer = Buffer.alloc(0);
  private phase: Phase = "pre";
  private sectionId = -1;
  private block = "";
  private lastWasEnd = false;
  /** Setup: bytes of blocks still to be listed, and whether each carries a guest address (x-ignore-shared). */
  private setupLeft = 0n;
  readonly blocks: { id: string; bytes: number }[] = [];
  pagesSeen = 0;

  private readonly out: (chunk: Buffer) => void;
  private readonly sink: RamPageSink;
  private readonly opts: { ramBlock: string; ignoreShared: boolean };

  constructor(out: (chunk: Buffer) => void, sink: RamPageSink, opts: { ramBlock: string; ignoreShared: boolean }) {
    this.out = out;
    this.sink = sink;
    this.opts = opts;
  }

  push(chunk: Buffer): void {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    this.run();
  }

  end(): void {
    this.run();
    if (this.phase !== "rest") throw new Error(`migration stream ended inside the RAM section (${this.phase})`);
    if (this.buf.length > 0) this.emit(this.buf.length);
  }

  private emit(n: number): void {
    if (n > 0) this.out(this.buf.subarray(0, n));
    this.buf = this.buf.subarray(n);
  }

  private drop(n: number): void {
    this.buf = this.buf.subarray(n);
  }

  private run(): void {
    for (;;) {
      const before = this.buf.length;
      const phase = this.phase;
      if (!this.step()) return;
      if (this.buf.length === before && this.phase === phase && phase !== "rest") throw new Error("migration stream parser made no progress");
    }
  }

  /** One step; false when more bytes are needed. */
  private step(): boolean {
    const b = this.buf;
    switch (this.phase) {
      case "pre": {
        const at = b.indexOf(RAM_START_TAIL);
        if (at < 0) {
          // Keep what could be the start of the header; pass the rest.
          this.emit(Math.max(0, b.length - RAM_START_TAIL.length - 5));
          return false;
        }
        if (at < 5 || b[at - 5] !== SECTION_START) throw new Error("RAM section header without its section start");
        this.sectionId = b.readUInt32BE(at - 4);
        this.emit(at + RAM_START_TAIL.length);
        this.phase = "setup";
        return true;
      }
      case "setup": {
        if (this.setupLeft === 0n) {
          if (b.length < 8) return false;
          const head = b.readBigUInt64BE(0);
          const flags = Number(head & 0xfffn);
          if (flags === FLAG_EOS && this.blocks.length > 0) {
            this.emit(8);
            this.phase = "footer";
            this.lastWasEnd = false;
            return true;
          }
          if (flags !== FLAG_MEM_SIZE) throw new Error(`RAM setup record with flags 0x${flags.toString(16)}`);
          this.setupLeft = head & ~0xfffn;
          this.emit(8);
          return true;
        }
        if (b.length < 1) return false;
        const len = b[0]!;
        const need = 1 + len + 8 + (this.opts.ignoreShared ? 8 : 0);
        if (b.length < need) return false;
        const id = b.subarray(1, 1 + len).toString("latin1");
        const bytes = b.readBigUInt64BE(1 + len);
        this.blocks.push({ id, bytes: Number(bytes) });
        this.setupLeft -= bytes;
        if (this.setupLeft < 0n) throw new Error("RAM setup lists more than its total");
        this.emit(need);
        return true;
      }
      case "footer": {
        if (b.length < 1) return false;
        if (b[0] === SECTION_FOOTER) {
          if (b.length < 5) return false;
          if (b.readUInt32BE(1) !== this.sectionId) throw new Error("RAM section footer of another section");
          this.emit(5);
        }
        this.phase = this.lastWasEnd ? "rest" : "sections";
        return true;
      }
      case "sections": {
        if (b.length < 5) return false;
        const type = b[0];
        if ((type === SECTION_PART || type === SECTION_END) && b.readUInt32BE(1) === this.sectionId) {
          this.lastWasEnd = type === SECTION_END;
          this.emit(5);
          this.phase = "records";
          return true;
        }
        this.phase = "rest"; // another section: the RAM section is over (or had no END of its own)
        return true;
      }
      case "records": {
        if (b.length < 8) return false;
        const head = b.readBigUInt64BE(0);
        const flags = Number(head & 0xfffn);
        const offset = Number(head & ~0xfffn);
        if (flags === FLAG_EOS) {
          this.emit(8);
          this.phase = "footer";
          return true;
        }
        let at = 8;
        let block = this.block;
        if (!(flags & FLAG_CONTINUE)) {
          if (b.length < 9) return false;
          const len = b[8]!;
          if (b.length < 9 + len) return false;
          block = b.subarray(9, 9 + len).toString("latin1");
          at = 9 + len;
        }
        const kind = flags & ~FLAG_CONTINUE;
        const body = kind === FLAG_PAGE ? PAGE : kind === FLAG_ZERO ? 1 : -1;
        if (body < 0) throw new Error(`RAM record with flags 0x${flags.toString(16)} (compression, XBZRLE or multifd are not handled)`);
        if (b.length < at + body) return false;
        this.block = block;
        if (block !== this.opts.ramBlock) {
          // A firmware block: kept in the stream. Its first record after one of the guest RAM's must name its block.
          this.emit(at + body);
          return true;
        }
        this.pagesSeen++;
        if (kind === FLAG_PAGE) this.sink.page(offset, b.subarray(at, at + PAGE), 0);
        else this.sink.page(offset, undefined, b[at]!);
        this.drop(at + body);
        return true;
      }
      case "rest":
        if (b.length === 0) return false;
        this.emit(b.length);
        return false;
    }
  }
}

/**
 * Writes the pages of a RAM stream into `file`, which starts as a copy of `base` (the template's RAM file): a page
 * equal to the base's is not written (with a reflinked copy its block stays shared). Reads the base in windows, in
 * order (QEMU sends pages by ascending address in each pass), from a page cache every clone shares.
 */
export class RamFileWriter implements RamPageSink {
  private readonly window = Buffer.alloc(1 << 20);
  private windowAt = -1;
  private windowLen = 0;
  written = 0;
  private readonly baseFd: number;
  private readonly fileFd: number;

  constructor(baseFd: number, fileFd: number) {
    this.baseFd = baseFd;
    this.fileFd = fileFd;
  }

  page(offset: number, data: Buffer | undefined, fill: number): void {
    const base = this.basePage(offset);
    const page = data ?? (fill === 0 ? ZERO_PAGE : Buffer.alloc(PAGE, fill));
    if (base.equals(page)) return;
    writeSync(this.fileFd, page, 0, PAGE, offset);
    this.written++;
  }

  private basePage(offset: number): Buffer {
    const start = offset - (offset % this.window.length);
    if (start !== this.windowAt) {
      this.windowLen = readSync(this.baseFd, this.window, 0, this.window.length, start);
      this.windowAt = start;
    }
    const at = offset - start;
    if (at + PAGE > this.windowLen) return ZERO_PAGE; // past the base's end: zeros, as a sparse file reads
    return this.window.subarray(at, at + PAGE);
  }
}
