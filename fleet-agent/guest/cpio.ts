// Writes a cpio "newc" archive (the initramfs format the kernel unpacks) without needing cpio or root.

export type CpioEntry =
  | { kind: "dir"; path: string; mode?: number }
  | { kind: "file"; path: string; data: Uint8Array; mode?: number }
  | { kind: "symlink"; path: string; target: string }
  | { kind: "chardev"; path: string; major: number; minor: number; mode?: number };

const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const S_IFLNK = 0o120000;
const S_IFCHR = 0o020000;

function hex8(n: number): string {
  return (n >>> 0).toString(16).padStart(8, "0");
}

function pad4(n: number): number {
  return (4 - (n % 4)) % 4;
}

/** Builds the archive; entries keep their order, so list a directory before what it holds. Timestamps are 0 for reproducible output. */
export function writeCpio(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  let ino = 1;
  const add = (name: string, mode: number, data: Uint8Array, rdev: { major: number; minor: number } = { major: 0, minor: 0 }, nlink = 1) => {
    const nameBytes = Buffer.from(`${name}\0`, "utf8");
    const header =
      "070701" +
      hex8(ino++) +
      hex8(mode) +
      hex8(0) + // uid
      hex8(0) + // gid
      hex8(nlink) +
      hex8(0) + // mtime
      hex8(data.length) +
      hex8(0) + // dev major
      hex8(0) + // dev minor
      hex8(rdev.major) +
      hex8(rdev.minor) +
      hex8(nameBytes.length) +
      hex8(0); // check
    parts.push(Buffer.from(header, "ascii"), nameBytes, Buffer.alloc(pad4(110 + nameBytes.length)));
    parts.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength), Buffer.alloc(pad4(data.length)));
  };
  for (const e of entries) {
    const name = e.path.replace(/^\/+/, "");
    if (!name) throw new Error("cpio: empty path");
    switch (e.kind) {
      case "dir":
        add(name, S_IFDIR | (e.mode ?? 0o755), new Uint8Array(0), undefined, 2);
        break;
      case "file":
        add(name, S_IFREG | (e.mode ?? 0o644), e.data);
        break;
      case "symlink":
        add(name, S_IFLNK | 0o777, Buffer.from(e.target, "utf8"));
        break;
      case "chardev":
        add(name, S_IFCHR | (e.mode ?? 0o600), new Uint8Array(0), { major: e.major, minor: e.minor });
        break;
    }
  }
  add("TRAILER!!!", 0, new Uint8Array(0));
  const archive = Buffer.concat(parts);
  // The kernel reads the archive in 512-byte blocks like cpio writes it; pad to be a well-formed file.
  return Buffer.concat([archive, Buffer.alloc(pad512(archive.length))]);
}

function pad512(n: number): number {
  return (512 - (n % 512)) % 512;
}

/** Parses a newc archive back into names, modes and data (for tests and inspection). */
export function readCpio(archive: Uint8Array): Array<{ name: string; mode: number; data: Buffer; rdevMajor: number; rdevMinor: number }> {
  const buf = Buffer.from(archive.buffer, archive.byteOffset, archive.byteLength);
  const out: Array<{ name: string; mode: number; data: Buffer; rdevMajor: number; rdevMinor: number }> = [];
  let off = 0;
  for (;;) {
    const magic = buf.toString("ascii", off, off + 6);
    if (magic !== "070701") throw new Error(`cpio: bad magic at ${off}`);
    const field = (i: number) => parseInt(buf.toString("ascii", off + 6 + i * 8, off + 14 + i * 8), 16);
    const mode = field(1);
    const size = field(6);
    const rdevMajor = field(9);
    const rdevMinor = field(10);
    const nameSize = field(11);
    const nameStart = off + 110;
    const name = buf.toString("utf8", nameStart, nameStart + nameSize - 1);
    const dataStart = nameStart + nameSize + pad4(110 + nameSize);
    if (name === "TRAILER!!!") return out;
    out.push({ name, mode, data: buf.subarray(dataStart, dataStart + size), rdevMajor, rdevMinor });
    off = dataStart + size + pad4(size);
  }
}
