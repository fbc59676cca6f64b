// Kernel module dependency order for the initramfs, read from each .ko's own .modinfo section (the
// Debian kernel package ships no modules.dep; depmod runs at install time, which we skip).
import { readFileSync } from "node:fs";

export interface ModuleInfo {
  name: string;
  depends: string[];
}

/** Reads `name=` and `depends=` from an ELF64 little-endian kernel module's .modinfo section. */
export function readModinfo(ko: Uint8Array): ModuleInfo {
  const buf = Buffer.from(ko.buffer, ko.byteOffset, ko.byteLength);
  if (buf.readUInt32BE(0) !== 0x7f454c46 || buf[4] !== 2 || buf[5] !== 1) throw new Error("not an ELF64 little-endian module");
  const shoff = Number(buf.readBigUInt64LE(0x28));
  const shentsize = buf.readUInt16LE(0x3a);
  const shnum = buf.readUInt16LE(0x3c);
  const shstrndx = buf.readUInt16LE(0x3e);
  const section = (i: number) => {
    const base = shoff + i * shentsize;
    return { nameOff: buf.readUInt32LE(base), offset: Number(buf.readBigUInt64LE(base + 0x18)), size: Number(buf.readBigUInt64LE(base + 0x20)) };
  };
  const strtab = section(shstrndx);
  const sectionName = (off: number) => {
    const start = strtab.offset + off;
    return buf.toString("latin1", start, buf.indexOf(0, start));
  };
  for (let i = 0; i < shnum; i++) {
    const s = section(i);
    if (sectionName(s.nameOff) !== ".modinfo") continue;
    const fields = buf.toString("latin1", s.offset, s.offset + s.size).split("\0");
    const get = (key: string) => fields.find((f) => f.startsWith(`${key}=`))?.slice(key.length + 1);
    const name = get("name");
    if (!name) throw new Error("module has no name= in .modinfo");
    const depends = (get("depends") ?? "").split(",").filter(Boolean);
    return { name, depends };
  }
  throw new Error("module has no .modinfo section");
}

/** Kernel module names use `_` and `-` interchangeably; files and modinfo may differ. */
export function normalizeModuleName(name: string): string {
  return name.replace(/-/g, "_");
}

/**
 * Resolves `wanted` (module names) plus everything they depend on into a load order (dependencies
 * first). `find` maps a normalized module name to its .ko path, or undefined when not shipped as a
 * module (built in, or absent) — such names are skipped.
 */
export function moduleLoadOrder(
  wanted: readonly string[],
  find: (name: string) => string | undefined,
  read: (path: string) => Uint8Array = readFileSync,
): Array<{ name: string; path: string }> {
  const order: Array<{ name: string; path: string }> = [];
  const state = new Map<string, "visiting" | "done">();
  const visit = (raw: string) => {
    const name = normalizeModuleName(raw);
    const seen = state.get(name);
    if (seen === "done") return;
    if (seen === "visiting") throw new Error(`module dependency cycle at ${name}`);
    const path = find(name);
    if (!path) {
      state.set(name, "done");
      return;
    }
    state.set(name, "visiting");
    for (const dep of readModinfo(read(path)).depends) visit(dep);
    state.set(name, "done");
    order.push({ name, path });
  };
  for (const w of wanted) visit(w);
  return order;
}
