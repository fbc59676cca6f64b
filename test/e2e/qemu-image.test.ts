// The guest image build from Debian's packages: cached on its inputs, an initramfs that holds what the guest needs, a whole vmlinux.
import { readFileSync, statSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { describe, expect, it } from "vitest";
import { readCpio, writeCpio } from "../../fleet-agent/guest/cpio.ts";
import { readModinfo } from "../../fleet-agent/guest/kmod.ts";
import { guestImage } from "../helpers/qemu.ts";
import { ensureGuestImage } from "../../fleet-agent/guest/build-image.ts";
import { dirname, resolve } from "node:path";

const S_IFMT = 0o170000;
const S_IFREG = 0o100000;
const S_IFLNK = 0o120000;
const S_IFCHR = 0o020000;

function isStaticElf(b: Buffer): boolean {
  if (b.readUInt32BE(0) !== 0x7f454c46) return false;
  const phoff = Number(b.readBigUInt64LE(0x20));
  const phentsize = b.readUInt16LE(0x36);
  const phnum = b.readUInt16LE(0x38);
  for (let i = 0; i < phnum; i++) if (b.readUInt32LE(phoff + i * phentsize) === 3) return false; // PT_INTERP
  return true;
}

describe("guest image", () => {
  it("is cached: a second ensureGuestImage with the same inputs rebuilds nothing", async () => {
    const image = await guestImage();
    const dataDir = resolve(dirname(image.kernel), "..", "..");
    const before = [image.kernel, image.initrd].map((f) => statSync(f).mtimeMs);
    const lines: string[] = [];
    const again = await ensureGuestImage({ dataDir, log: (l) => lines.push(l) });
    expect(again).toEqual(image);
    expect(lines.join("\n")).toMatch(/up to date/);
    expect([again.kernel, again.initrd].map((f) => statSync(f).mtimeMs)).toEqual(before);
  });

  it("has an initramfs with init, static busybox and applets, the static guest agent, launcher and workload, a console node, and modules in dependency order", async () => {
    const image = await guestImage();
    const entries = readCpio(gunzipSync(readFileSync(image.initrd)));
    const byName = new Map(entries.map((e) => [e.name, e]));
    const file = (name: string) => {
      const e = byName.get(name);
      expect(e, name).toBeDefined();
      return e!;
    };
    const init = file("init");
    expect(init.mode & S_IFMT).toBe(S_IFREG);
    expect(init.mode & 0o111).not.toBe(0);
    expect(init.data.toString("utf8", 0, 9)).toBe("#!/bin/sh");
    expect(isStaticElf(file("bin/busybox").data)).toBe(true);
    expect(isStaticElf(file("sbin/guest-agent").data)).toBe(true);
    expect(isStaticElf(file("usr/bin/demo-agent").data)).toBe(true);
    const sh = file("bin/sh");
    expect(sh.mode & S_IFMT).toBe(S_IFLNK);
    expect(sh.data.toString()).toBe("/bin/busybox");
    const console = file("dev/console");
    expect(console.mode & S_IFMT).toBe(S_IFCHR);
    expect([console.rdevMajor, console.rdevMinor]).toEqual([5, 1]);

    const order = file("etc/modules").data.toString().trim().split("\n");
    for (const wanted of ["virtio_mmio", "virtio_net", "virtio_console", "net_failover"]) expect(order).toContain(wanted);
    order.forEach((name, i) => {
      const deps = readModinfo(file(`lib/modules/${name}.ko`).data).depends;
      for (const dep of deps) expect(order.indexOf(dep), `${dep} before ${name}`).toBeGreaterThanOrEqual(0);
      for (const dep of deps) expect(order.indexOf(dep), `${dep} before ${name}`).toBeLessThan(i);
    });

    // What a built image's VM needs besides: the launcher, and the block and overlay modules (loaded after the base
    // ones, only when the VM has virtio block devices), each after what it depends on.
    expect(isStaticElf(file("sbin/launch").data)).toBe(true);
    const imageOrder = file("etc/modules.image").data.toString().trim().split("\n");
    expect(imageOrder).toContain("virtio_blk");
    expect(imageOrder).toContain("overlay");
    const all = [...order, ...imageOrder];
    imageOrder.forEach((name) => {
      expect(order, `${name} is loaded for images only`).not.toContain(name);
      for (const dep of readModinfo(file(`lib/modules/${name}.ko`).data).depends)
        expect(all.indexOf(dep), `${dep} before ${name}`).toBeLessThan(all.indexOf(name));
    });
  });

  it("extracts a whole ELF vmlinux from the bzImage (every segment and the section table inside the file)", async () => {
    const image = await guestImage();
    expect(image.vmlinux).toBeDefined();
    const elf = readFileSync(image.vmlinux!);
    expect(elf.readUInt32BE(0)).toBe(0x7f454c46);
    expect(elf.readUInt16LE(0x12)).toBe(62); // x86-64
    const shoff = Number(elf.readBigUInt64LE(0x28));
    expect(shoff + elf.readUInt16LE(0x3a) * elf.readUInt16LE(0x3c)).toBeLessThanOrEqual(elf.length);
    const phoff = Number(elf.readBigUInt64LE(0x20));
    const loads: number[] = [];
    for (let i = 0; i < elf.readUInt16LE(0x38); i++) {
      const ph = phoff + i * elf.readUInt16LE(0x36);
      if (elf.readUInt32LE(ph) !== 1) continue; // PT_LOAD
      const end = Number(elf.readBigUInt64LE(ph + 0x08)) + Number(elf.readBigUInt64LE(ph + 0x20));
      loads.push(end);
      expect(end).toBeLessThanOrEqual(elf.length);
    }
    expect(loads.length).toBeGreaterThan(1);
    expect(Math.max(...loads)).toBeGreaterThan(20_000_000); // the kernel itself, not a fragment
  });

  it("writes cpio newc that reads back entry by entry", () => {
    const archive = writeCpio([
      { kind: "dir", path: "etc" },
      { kind: "file", path: "etc/hello", data: Buffer.from("hi there"), mode: 0o600 },
      { kind: "symlink", path: "etc/link", target: "hello" },
      { kind: "chardev", path: "null", major: 1, minor: 3, mode: 0o666 },
    ]);
    expect(archive.length % 512).toBe(0);
    const back = readCpio(archive);
    expect(back.map((e) => [e.name, (e.mode & 0o7777).toString(8), e.data.toString()])).toEqual([
      ["etc", "755", ""],
      ["etc/hello", "600", "hi there"],
      ["etc/link", "777", "hello"],
      ["null", "666", ""],
    ]);
    expect(back[3]).toMatchObject({ rdevMajor: 1, rdevMinor: 3 });
  });
});
