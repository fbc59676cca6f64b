// The migration-stream splitter of a template's clone (fleet-agent/drivers/qemu/ram-stream.ts) on a synthetic QEMU 7.2
// stream: guest RAM records out, everything else kept byte for byte, in any chunking; pages equal to the base unwritten.
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { RamFileWriter, RamStreamSplitter } from "../../fleet-agent/drivers/qemu/ram-stream.ts";

const be64 = (n: number) => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt(n));
  return b;
};
const be32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};
const id = (s: string) => Buffer.concat([Buffer.from([s.length]), Buffer.from(s, "latin1")]);
const page = (fill: number) => Buffer.alloc(4096, fill);
const SID = 2;

/** A stream: header and configuration, the RAM section (setup, one part, the end), then a device's section. */
function stream() {
  const header = Buffer.concat([Buffer.from("QEVM"), be32(3), Buffer.from([0x07]), be32(7), Buffer.from("microvm")]);
  const start = Buffer.concat([Buffer.from([0x01]), be32(SID), id("ram"), be32(0), be32(4)]);
  const setup = Buffer.concat([be64((8192 + 4096) | 0x04), id("mem"), be64(8192), be64(0), id("bios"), be64(4096), be64(0xfffc0000), be64(0x10)]);
  const footer = Buffer.concat([Buffer.from([0x7e]), be32(SID)]);
  const memPage = Buffer.concat([be64(0 | 0x08), id("mem"), page(7)]);
  const memZero = Buffer.concat([be64(4096 | 0x02 | 0x20), Buffer.from([0])]);
  const biosPage = Buffer.concat([be64(0 | 0x08), id("bios"), page(9)]);
  const biosMore = Buffer.concat([be64(0 | 0x02 | 0x20), Buffer.from([0])]);
  const part = Buffer.concat([Buffer.from([0x02]), be32(SID), memPage, memZero, biosPage, biosMore, be64(0x10), footer]);
  const end = Buffer.concat([Buffer.from([0x03]), be32(SID), be64(0x10), footer]);
  const device = Buffer.concat([Buffer.from([0x04]), be32(3), id("device-state"), be32(0), be32(1), Buffer.from("some device bytes"), Buffer.from([0x1f])]);
  const full = Buffer.concat([header, start, setup, footer, part, end, device]);
  const kept = Buffer.concat([header, start, setup, footer, Buffer.from([0x02]), be32(SID), biosPage, biosMore, be64(0x10), footer, end, device]);
  return { full, kept };
}

function split(data: Buffer, chunk: number) {
  const out: Buffer[] = [];
  const pages: { offset: number; fill: number | undefined; first: number | undefined }[] = [];
  const s = new RamStreamSplitter(
    (c) => out.push(Buffer.from(c)),
    { page: (offset, d, fill) => pages.push({ offset, fill: d ? undefined : fill, first: d?.[0] }) },
    { ramBlock: "mem", ignoreShared: true },
  );
  for (let i = 0; i < data.length; i += chunk) s.push(data.subarray(i, i + chunk));
  s.end();
  return { out: Buffer.concat(out), pages, blocks: s.blocks };
}

describe("RamStreamSplitter", () => {
  it("takes the guest RAM's records out and keeps every other byte as it was, however the stream is cut", () => {
    const { full, kept } = stream();
    for (const chunk of [1, 7, 4096, full.length]) {
      const r = split(full, chunk);
      expect(r.out.equals(kept), `chunks of ${chunk}`).toBe(true);
      expect(r.pages).toEqual([
        { offset: 0, fill: undefined, first: 7 },
        { offset: 4096, fill: 0, first: undefined },
      ]);
      expect(r.blocks).toEqual([
        { id: "mem", bytes: 8192 },
        { id: "bios", bytes: 4096 },
      ]);
    }
  });

  it("refuses what it does not understand (a compressed page) and a stream cut inside the RAM section", () => {
    const { full } = stream();
    const at = full.indexOf(Buffer.concat([be64(0 | 0x08), id("mem")]));
    const compressed = Buffer.from(full);
    compressed.writeBigUInt64BE(BigInt(0x100), at);
    expect(() => split(compressed, 64)).toThrow(/flags 0x100/);
    expect(() => split(full.subarray(0, at + 100), 64)).toThrow(/ended inside the RAM section/);
  });
});

describe("RamFileWriter", () => {
  it("writes only the pages that differ from the base, zero pages included", () => {
    const dir = mkdtempSync(join(tmpdir(), "ram-writer-"));
    try {
      const base = Buffer.concat([page(1), page(0), page(3)]);
      writeFileSync(join(dir, "base"), base);
      writeFileSync(join(dir, "file"), base);
      const baseFd = openSync(join(dir, "base"), "r");
      const fileFd = openSync(join(dir, "file"), "r+");
      const w = new RamFileWriter(baseFd, fileFd);
      w.page(0, page(1), 0); // the same as the base: not written
      w.page(4096, undefined, 0); // a zero page over a zero page: not written
      w.page(8192, undefined, 0); // a zero page over data: written
      w.page(4096 * 5, page(5), 0); // past the base's end: written
      closeSync(baseFd);
      closeSync(fileFd);
      expect(w.written).toBe(2);
      const after = readFileSync(join(dir, "file"));
      expect(after.subarray(8192, 12288).equals(page(0))).toBe(true);
      expect(after.subarray(4096 * 5).equals(page(5))).toBe(true);
      expect(after.subarray(0, 4096).equals(page(1))).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
