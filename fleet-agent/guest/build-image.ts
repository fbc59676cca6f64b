// Builds the guest image (kernel, initramfs, ELF vmlinux) from Debian packages and the sources beside this file;
// cached on a hash of its inputs (this file included). The same kernel and initramfs run the built-in demo and, given
// a built image's drives, that image's entrypoint (init.sh, launch.c); the exec server (guest-exec/) runs in both.
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, join, resolve } from "node:path";
import { gzipSync } from "node:zlib";
import { compileStatic, gccVersion } from "../../lib/node-c-tool.ts";
import { takeLock } from "../../lib/node-lock.ts";
import { rememberWhileAptUnchanged } from "./apt-memo.ts";
import { GUEST_EXEC_HEADERS, GUEST_EXEC_SOURCES } from "./guest-exec/sources.ts";
import { writeCpio, type CpioEntry } from "./cpio.ts";
import { moduleLoadOrder, normalizeModuleName } from "./kmod.ts";
import { extractVmlinux } from "./vmlinux.ts";

export interface GuestImage {
  /** bzImage for QEMU (`-kernel`). */
  kernel: string;
  /** gzip'd cpio initramfs (`-initrd`). */
  initrd: string;
  /** Uncompressed ELF kernel for Firecracker; absent when it could not be extracted. */
  vmlinux?: string;
  kernelRelease: string;
  /** Hash of the inputs the image was built from. */
  key: string;
}

/** A kernel of one's own instead of Debian's cloud kernel (`GUEST_KERNEL`, `GUEST_KERNEL_MODULES`). */
export interface CustomKernel {
  /** ELF vmlinux or bzImage. */
  path: string;
  /** `lib/modules/<release>` of that kernel, when it has the virtio drivers as modules. */
  modulesDir?: string;
}

export interface EnsureGuestImageOptions {
  /** Data directory; the image goes to `<dataDir>/images/demo/`. */
  dataDir: string;
  /** One progress line at a time. */
  log?: (line: string) => void;
  kernel?: CustomKernel;
}

/** The custom kernel named by the environment, for the scripts that read it at their edge. */
export function customKernelFromEnv(env: Record<string, string | undefined>): CustomKernel | undefined {
  const path = env.GUEST_KERNEL;
  if (!path) return undefined;
  const kernel: CustomKernel = { path: resolve(path) };
  if (env.GUEST_KERNEL_MODULES) kernel.modulesDir = resolve(env.GUEST_KERNEL_MODULES);
  return kernel;
}

/** The meta-package whose dependency names the current cloud kernel package. */
const KERNEL_META = "linux-image-cloud-amd64";
/** What the guest needs as modules (the rest of virtio is built into Debian's cloud kernel or pulled in as a dependency). */
const WANTED_MODULES = [
  "virtio_ring",
  "virtio",
  "virtio_mmio",
  "failover",
  "net_failover",
  "virtio_net",
  "virtio_console",
  "vsock",
  "vmw_vsock_virtio_transport_common",
  "vmw_vsock_virtio_transport",
];
/** Loaded only when the VM has virtio block devices (a built image's drives): the demo boots without them. ext4 is built into Debian's cloud kernel. */
const IMAGE_MODULES = ["virtio_blk", "overlay"];
const GUEST_SOURCES = import.meta.dirname;
/** The guest agent's parts (guest-agent/agent.h says which does what), compiled together into one binary. */
const GUEST_AGENT_SOURCES = [
  "main.c",
  "protocol.c",
  "reply.c",
  "clock.c",
  "leases.c",
  "identity.c",
  "checkpoints.c",
  "execkey.c",
  "probe.c",
  "listening.c",
].map((f) => `guest-agent/${f}`);
/** The demo agent's parts (demo-agent/demo.h says which does what), compiled together into one binary. */
const DEMO_AGENT_SOURCES = ["main.c", "http.c", "routes.c", "fetch.c", "clock.c"].map((f) => `demo-agent/${f}`);
/** Everything in the image comes from these (and the packages): a change to any of them means a rebuild. */
const SOURCE_FILES = [
  "init.sh",
  ...GUEST_AGENT_SOURCES,
  "guest-agent/agent.h",
  ...GUEST_EXEC_SOURCES,
  ...GUEST_EXEC_HEADERS,
  "guest-exec/sources.ts",
  "launch.c",
  ...DEMO_AGENT_SOURCES,
  "demo-agent/demo.h",
  "cpio.ts",
  "kmod.ts",
  "vmlinux.ts",
  "build-image.ts",
];
const BUSYBOX_CANDIDATES = ["/bin/busybox", "/usr/bin/busybox"];

function run(cmd: string, args: string[], opts: { cwd?: string } = {}): string {
  return execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], ...opts });
}

function sha256(data: string | Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

/** The versioned kernel package the meta-package depends on, and its candidate version (local apt data, no network). */
export function resolveKernelPackage(): { pkg: string; version: string } {
  const depends = run("apt-cache", ["depends", KERNEL_META]);
  const pkg = /Depends:\s*(linux-image-[^\s]+)/.exec(depends)?.[1];
  if (!pkg) throw new Error(`apt-cache depends ${KERNEL_META} names no linux-image package (run apt-get update)`);
  const policy = run("apt-cache", ["policy", pkg]);
  const version = /Candidate:\s*(\S+)/.exec(policy)?.[1];
  if (!version || version === "(none)") throw new Error(`no candidate version for ${pkg} (run apt-get update)`);
  return { pkg, version };
}

function findBusybox(): { path: string; version: string } {
  for (const path of BUSYBOX_CANDIDATES) {
    if (!existsSync(path)) continue;
    const elf = readFileSync(path);
    if (hasInterpreter(elf)) continue; // dynamically linked: useless in an initramfs without libc
    const banner = spawnSync(path, [], { encoding: "utf8" });
    const version = /BusyBox (v\S+(?: \([^)]*\))?)/.exec(`${banner.stdout}${banner.stderr}`)?.[1] ?? "unknown";
    return { path, version: `${version} sha256:${sha256(elf).slice(0, 16)}` };
  }
  throw new Error("no static busybox found (apt-get install -y busybox-static)");
}

/** True when an ELF64 file asks for a dynamic loader (PT_INTERP). */
function hasInterpreter(elf: Buffer): boolean {
  if (elf.length < 64 || elf.readUInt32BE(0) !== 0x7f454c46) return true;
  const phoff = Number(elf.readBigUInt64LE(0x20));
  const phentsize = elf.readUInt16LE(0x36);
  const phnum = elf.readUInt16LE(0x38);
  for (let i = 0; i < phnum; i++) if (elf.readUInt32LE(phoff + i * phentsize) === 3) return true;
  return false;
}

function imageDir(dataDir: string): string {
  return join(resolve(dataDir), "images", "demo");
}

interface Inputs {
  kernel: { pkg: string; version: string } | { custom: string; sha256: string; modulesDir?: string; modules?: string };
  busybox: { path: string; version: string };
  gcc: string;
  sources: Record<string, string>;
  modules: string[];
  imageModules: string[];
}

/** The build's inputs; `dir` (the image's directory) keeps apt's answer on the kernel package while apt's state is unchanged. */
function gatherInputs(custom: CustomKernel | undefined, dir: string): Inputs {
  const sources: Record<string, string> = {};
  for (const f of SOURCE_FILES) sources[f] = sha256(readFileSync(join(GUEST_SOURCES, f)));
  let kernel: Inputs["kernel"];
  if (custom) {
    kernel = { custom: custom.path, sha256: sha256(readFileSync(custom.path)) };
    if (custom.modulesDir) {
      kernel.modulesDir = custom.modulesDir;
      // Names and sizes of the module files: enough to notice a rebuilt tree without hashing all of it.
      kernel.modules = sha256(
        walk(custom.modulesDir)
          .filter((f) => f.endsWith(".ko"))
          .sort()
          .map((f) => `${f}:${statSync(f).size}`)
          .join("\n"),
      );
    }
  } else {
    kernel = rememberWhileAptUnchanged(join(dir, ".kernel-package.json"), resolveKernelPackage);
  }
  return { kernel, busybox: findBusybox(), gcc: gccVersion(), sources, modules: WANTED_MODULES, imageModules: IMAGE_MODULES };
}

interface Manifest {
  key: string;
  inputs: Inputs;
  kernelRelease: string;
  files: { kernel: string; initrd: string; vmlinux?: string };
  vmlinuxError?: string;
  builtAt: string;
}

function readManifest(dir: string): Manifest | undefined {
  try {
    return JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8")) as Manifest;
  } catch {
    return undefined;
  }
}

function toImage(dir: string, m: Manifest): GuestImage {
  const image: GuestImage = { kernel: join(dir, m.files.kernel), initrd: join(dir, m.files.initrd), kernelRelease: m.kernelRelease, key: m.key };
  if (m.files.vmlinux) image.vmlinux = join(dir, m.files.vmlinux);
  return image;
}

function upToDate(dir: string, key: string): GuestImage | undefined {
  const m = readManifest(dir);
  if (!m || m.key !== key) return undefined;
  const image = toImage(dir, m);
  if (![image.kernel, image.initrd, ...(image.vmlinux ? [image.vmlinux] : [])].every((f) => existsSync(f))) return undefined;
  return image;
}

/**
 * Returns the demo guest image, building it first when its inputs changed (kernel package version,
 * busybox, compiler, sources). Safe to call from several processes at once: one builds, the others wait.
 */
export async function ensureGuestImage(opts: EnsureGuestImageOptions): Promise<GuestImage> {
  const log = opts.log ?? ((line: string) => console.log(line));
  const dir = imageDir(opts.dataDir);
  const inputs = gatherInputs(opts.kernel, dir);
  const key = sha256(JSON.stringify(inputs));
  const cached = upToDate(dir, key);
  if (cached) {
    log(`guest image: up to date (${key.slice(0, 12)}) in ${dir}`);
    return cached;
  }
  mkdirSync(dir, { recursive: true });
  const release = await takeLock(join(dir, ".build.lock"), { onWait: (holder) => log(`guest image: waiting for the build in process ${holder}`) });
  try {
    const built = upToDate(dir, key); // another process may have built it while we waited
    if (built) {
      log(`guest image: built by another process (${key.slice(0, 12)})`);
      return built;
    }
    return build(dir, opts.dataDir, inputs, key, log);
  } finally {
    release();
  }
}

/** Finds the kernel .deb in apt's cache or ours, else downloads it with apt-get (Debian's mirrors only). */
function fetchKernelDeb(cacheDir: string, kernel: { pkg: string; version: string }, log: (line: string) => void): string {
  const file = `${kernel.pkg}_${kernel.version.replace(/:/g, "%3a")}_amd64.deb`;
  for (const candidate of [join("/var/cache/apt/archives", file), join(cacheDir, file)]) if (existsSync(candidate)) return candidate;
  mkdirSync(cacheDir, { recursive: true });
  log(`guest image: apt-get download ${kernel.pkg}=${kernel.version}`);
  const download = () => spawnSync("apt-get", ["download", `${kernel.pkg}=${kernel.version}`], { cwd: cacheDir, encoding: "utf8" });
  let result = download();
  if (result.status !== 0 && process.getuid?.() === 0) {
    log("guest image: apt-get download failed; running apt-get update and retrying");
    spawnSync("apt-get", ["update"], { stdio: "ignore" });
    result = download();
  }
  const path = join(cacheDir, file);
  if (result.status !== 0 || !existsSync(path))
    throw new Error(`apt-get download ${kernel.pkg}=${kernel.version} failed: ${(result.stderr || "").trim().split("\n").pop()}`);
  return path;
}

function walk(dir: string, out: string[] = []): string[] {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    if (entry.isDirectory()) walk(p, out);
    else out.push(p);
  }
  return out;
}

/** Compiles and links `sources` (one program) into `output`. */
function compile(sources: string[], output: string, extra: string[] = []): void {
  const failed = compileStatic(sources, output, extra);
  if (failed) throw new Error(`gcc ${basename(output)} failed:\n${failed.stderr}`);
}

function build(dir: string, dataDir: string, inputs: Inputs, key: string, log: (line: string) => void): GuestImage {
  const started = performance.now();
  const work = join(dir, `.build-${process.pid}`);
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  try {
    const k = inputs.kernel;
    let kernelPath: string;
    let modulesDir: string | undefined;
    let kernelRelease: string;
    if ("custom" in k) {
      log(`guest image: building ${key.slice(0, 12)} (custom kernel ${k.custom}, busybox ${inputs.busybox.version})`);
      kernelPath = k.custom;
      modulesDir = k.modulesDir;
      kernelRelease = modulesDir ? basename(modulesDir) : "custom";
    } else {
      log(`guest image: building ${key.slice(0, 12)} (kernel ${k.pkg} ${k.version}, busybox ${inputs.busybox.version})`);
      const deb = fetchKernelDeb(join(resolve(dataDir), "images", "cache"), k, log);
      log(`guest image: unpacking ${basename(deb)}`);
      const root = join(work, "deb");
      run("dpkg-deb", ["-x", deb, root]);
      const vmlinuz = readdirSync(join(root, "boot")).find((f) => f.startsWith("vmlinuz-"));
      const releases = readdirSync(join(root, "lib", "modules"));
      if (!vmlinuz || releases.length !== 1) throw new Error(`unexpected kernel package layout in ${basename(deb)}`);
      kernelRelease = releases[0]!;
      kernelPath = join(root, "boot", vmlinuz);
      modulesDir = join(root, "lib", "modules", kernelRelease);
    }

    log("guest image: compiling guest-agent, guest-exec, launch and demo-agent (gcc -static -O2)");
    compile(
      GUEST_AGENT_SOURCES.map((f) => join(GUEST_SOURCES, f)),
      join(work, "guest-agent"),
    );
    compile(
      GUEST_EXEC_SOURCES.map((f) => join(GUEST_SOURCES, f)),
      join(work, "guest-exec"),
    );
    compile([join(GUEST_SOURCES, "launch.c")], join(work, "launch"));
    compile(
      DEMO_AGENT_SOURCES.map((f) => join(GUEST_SOURCES, f)),
      join(work, "demo-agent"),
      ["-pthread"],
    );

    // Modules the kernel has built in are simply not found here, and skipped.
    const moduleFiles = new Map<string, string>();
    for (const f of modulesDir ? walk(modulesDir) : []) {
      if (f.endsWith(".ko")) moduleFiles.set(normalizeModuleName(basename(f, ".ko")), f);
    }
    const modules = moduleLoadOrder(WANTED_MODULES, (name) => moduleFiles.get(name));
    const loaded = new Set(modules.map((m) => m.name));
    const imageModules = moduleLoadOrder(inputs.imageModules, (name) => moduleFiles.get(name)).filter((m) => !loaded.has(m.name));
    log(`guest image: modules in load order: ${modules.map((m) => m.name).join(" ")}; for images: ${imageModules.map((m) => m.name).join(" ")}`);

    const entries: CpioEntry[] = [];
    for (const d of ["bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "etc", "lib", "lib/modules", "root", "var"]) {
      entries.push({ kind: "dir", path: d, mode: d === "tmp" ? 0o1777 : 0o755 });
    }
    entries.push({ kind: "chardev", path: "dev/console", major: 5, minor: 1, mode: 0o600 });
    entries.push({ kind: "chardev", path: "dev/null", major: 1, minor: 3, mode: 0o666 });
    entries.push({ kind: "file", path: "bin/busybox", data: readFileSync(inputs.busybox.path), mode: 0o755 });
    const applets = run(inputs.busybox.path, ["--list-full"]).split("\n").filter(Boolean);
    for (const applet of applets) {
      if (applet === "bin/busybox") continue;
      entries.push({ kind: "symlink", path: applet, target: "/bin/busybox" });
    }
    entries.push({ kind: "file", path: "init", data: readFileSync(join(GUEST_SOURCES, "init.sh")), mode: 0o755 });
    entries.push({ kind: "file", path: "sbin/guest-agent", data: readFileSync(join(work, "guest-agent")), mode: 0o755 });
    entries.push({ kind: "file", path: "sbin/guest-exec", data: readFileSync(join(work, "guest-exec")), mode: 0o755 });
    entries.push({ kind: "file", path: "sbin/launch", data: readFileSync(join(work, "launch")), mode: 0o755 });
    entries.push({ kind: "file", path: "usr/bin/demo-agent", data: readFileSync(join(work, "demo-agent")), mode: 0o755 });
    entries.push({ kind: "file", path: "etc/modules", data: Buffer.from(modules.map((m) => `${m.name}\n`).join("")) });
    entries.push({ kind: "file", path: "etc/modules.image", data: Buffer.from(imageModules.map((m) => `${m.name}\n`).join("")) });
    entries.push({ kind: "file", path: "etc/passwd", data: Buffer.from("root:x:0:0:root:/root:/bin/sh\n") });
    entries.push({ kind: "file", path: "etc/group", data: Buffer.from("root:x:0:\n") });
    for (const m of [...modules, ...imageModules]) entries.push({ kind: "file", path: `lib/modules/${m.name}.ko`, data: readFileSync(m.path) });
    const initrd = gzipSync(writeCpio(entries), { level: 9 });
    log(`guest image: initramfs ${entries.length} entries, ${(initrd.length / 1e6).toFixed(1)} MB gzip'd`);

    const kernelImage = readFileSync(kernelPath);
    const files: Manifest["files"] = { kernel: "vmlinuz", initrd: "initrd.img" };
    let vmlinuxError: string | undefined;
    writeFileSync(join(work, "vmlinuz"), kernelImage); // an ELF kernel here boots in QEMU by its PVH note
    writeFileSync(join(work, "initrd.img"), initrd);
    try {
      const isElf = kernelImage.length > 4 && kernelImage.readUInt32BE(0) === 0x7f454c46;
      const { vmlinux, format } = isElf ? { vmlinux: kernelImage, format: "already ELF" } : extractVmlinux(kernelImage);
      writeFileSync(join(work, "vmlinux"), vmlinux);
      files.vmlinux = "vmlinux";
      log(`guest image: vmlinux (${format}, ${(vmlinux.length / 1e6).toFixed(1)} MB)`);
    } catch (err) {
      vmlinuxError = (err as Error).message;
      log(`guest image: no vmlinux: ${vmlinuxError}`);
    }
    // Files first, manifest last: a reader trusts the files only once the manifest names this key.
    rmSync(join(dir, "manifest.json"), { force: true });
    for (const f of Object.values(files)) renameSync(join(work, f), join(dir, f));
    if (!files.vmlinux) rmSync(join(dir, "vmlinux"), { force: true });
    const manifest: Manifest = { key, inputs, kernelRelease, files, builtAt: new Date().toISOString() };
    if (vmlinuxError) manifest.vmlinuxError = vmlinuxError;
    writeFileSync(join(work, "manifest.json"), `${JSON.stringify(manifest, null, 2)}\n`);
    renameSync(join(work, "manifest.json"), join(dir, "manifest.json"));
    log(`guest image: built in ${((performance.now() - started) / 1000).toFixed(1)} s → ${dir}`);
    return toImage(dir, manifest);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
