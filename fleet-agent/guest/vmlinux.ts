// Extracts the uncompressed ELF vmlinux from a bzImage (what the kernel's scripts/extract-vmlinux
// does): find the compressed payload by its magic, decompress it, keep the first result that is ELF.
// Firecracker boots an ELF vmlinux; QEMU takes the bzImage itself.
import { gunzipSync, zstdDecompressSync } from "node:zlib";

const LZ4_LEGACY_MAGIC = 0x184c2102;
const LZ4_LEGACY_BLOCK = 8 << 20;
const LZ4_BLOCK_BOUND = LZ4_LEGACY_BLOCK + Math.floor(LZ4_LEGACY_BLOCK / 255) + 16;

/** Decompresses one raw LZ4 block into `out` starting at `op`; returns the new output position. */
function lz4Block(src: Buffer, start: number, end: number, out: Buffer, op: number): number {
  let ip = start;
  for (;;) {
    const token = src[ip++]!;
    let literals = token >> 4;
    if (literals === 15) {
      let b: number;
      do {
        b = src[ip++]!;
        literals += b;
      } while (b === 255);
    }
    if (ip + literals > end || op + literals > out.length) throw new Error("lz4: literal run past the end");
    src.copy(out, op, ip, ip + literals);
    ip += literals;
    op += literals;
    if (ip >= end) return op; // the last sequence holds literals only
    const offset = src[ip]! | (src[ip + 1]! << 8);
    ip += 2;
    if (offset === 0 || offset > op) throw new Error("lz4: bad match offset");
    let match = token & 15;
    if (match === 15) {
      let b: number;
      do {
        b = src[ip++]!;
        match += b;
      } while (b === 255);
    }
    match += 4;
    if (op + match > out.length) throw new Error("lz4: match past the end");
    let from = op - offset;
    if (offset >= match) {
      out.copy(out, op, from, from + match);
      op += match;
    } else {
      for (let i = 0; i < match; i++) out[op++] = out[from++]!;
    }
  }
}

/** LZ4 legacy frame (what `lz4 -l` writes and the kernel uses): magic, then [u32 size][block]... until something that is no block. */
export function lz4LegacyDecompress(src: Buffer, start: number): Buffer {
  if (src.readUInt32LE(start) !== LZ4_LEGACY_MAGIC) throw new Error("lz4: no legacy magic");
  let ip = start + 4;
  const blocks: Buffer[] = [];
  while (ip + 4 <= src.length) {
    const size = src.readUInt32LE(ip);
    if (size === LZ4_LEGACY_MAGIC || size === 0 || size > LZ4_BLOCK_BOUND || ip + 4 + size > src.length) break;
    const out = Buffer.allocUnsafe(LZ4_LEGACY_BLOCK);
    const n = lz4Block(src, ip + 4, ip + 4 + size, out, 0);
    blocks.push(out.subarray(0, n));
    ip += 4 + size;
    if (n < LZ4_LEGACY_BLOCK) break; // only the last block is short
  }
  return Buffer.concat(blocks);
}

function isElf(b: Buffer): boolean {
  return b.length > 64 && b.readUInt32BE(0) === 0x7f454c46;
}

interface Format {
  name: string;
  magic: Buffer;
  decompress: (image: Buffer, at: number) => Buffer;
}

const formats: Format[] = [
  { name: "lz4", magic: Buffer.from([0x02, 0x21, 0x4c, 0x18]), decompress: lz4LegacyDecompress },
  { name: "gzip", magic: Buffer.from([0x1f, 0x8b, 0x08]), decompress: (img, at) => gunzipSync(img.subarray(at), { finishFlush: 2 }) },
  { name: "zstd", magic: Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), decompress: (img, at) => zstdDecompressSync(img.subarray(at)) },
];

/** Returns the ELF vmlinux inside a bzImage and the compression it used; throws when none of the known formats yields one. */
export function extractVmlinux(bzImage: Buffer): { vmlinux: Buffer; format: string } {
  const tried: string[] = [];
  for (const f of formats) {
    for (let at = bzImage.indexOf(f.magic); at >= 0; at = bzImage.indexOf(f.magic, at + 1)) {
      try {
        const out = f.decompress(bzImage, at);
        if (isElf(out)) return { vmlinux: out, format: f.name };
        tried.push(`${f.name}@${at}: not ELF`);
      } catch (err) {
        tried.push(`${f.name}@${at}: ${(err as Error).message}`);
      }
    }
  }
  throw new Error(`no ELF payload found in the kernel image (${tried.slice(0, 5).join("; ") || "no known compression magic"})`);
}
