// The Debian base images a Containerfile names in FROM: built with debootstrap from this host's Debian mirror, cached, committed into buildah's storage.
//
// Names. A Containerfile says `FROM agentvm/node:bookworm` (or `agentvm/python:bookworm`, `agentvm/debian:bookworm`;
// `:latest` is the same image). The image is committed as `localhost/agentvm/node:bookworm`, and buildah resolves a
// short name in FROM by looking in local storage for `localhost/<name>` first (then `docker.io/<name>`, which
// `--pull=false` only pulls when nothing local matched): measured with buildah 1.28, `FROM agentvm/node:bookworm`
// and `FROM localhost/agentvm/node:bookworm` both build from the local image without any registry.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { compileStatic, gccVersion } from "../../lib/node-c-tool.ts";
import { AppError } from "../../lib/errors.ts";
import { buildahCommitScratch, buildahImageLabels, buildahRemoveImage, buildahSetup } from "./buildah.ts";
import { takeLock } from "../../lib/node-lock.ts";
import { run, tailText } from "./run.ts";
import { requireTools } from "./tools.ts";
import { DESKTOP_LABEL } from "./unpack.ts";
import type { BuildEvent } from "./events.ts";

export interface BaseSpec {
  /** Repository in local storage, without `localhost/`: `agentvm/node`. */
  repo: string;
  tag: string;
  suite: string;
  /** Packages on top of `--variant=minbase`. */
  include: string[];
  /** Files of ours put into the image when it is committed (scripts, helpers): not part of the debootstrapped root. */
  files?: readonly BaseFile[];
  /** `buildah config` flags beyond the common ones (environment, entrypoint, labels). */
  config?: readonly string[];
  /**
   * Paths (globs in their last part: `dir/*.so`) removed from the image when it is committed: files a package brings
   * that the base never uses. dpkg still lists their packages.
   */
  prune?: readonly string[];
}

export interface BaseFile {
  /** Absolute path in the image. */
  path: string;
  /** The file in this repository it is copied from (with `compile`, the C source it is built from). */
  source: string;
  mode: number;
  /**
   * Built from `source` with this host's gcc (`-static -O2`, then these flags) when the base is committed: a static
   * program runs in any image built FROM the base, whatever its libc. The source and the compiler's version are in
   * the image's key: changing either recommits the base.
   */
  compile?: { flags: readonly string[] };
  /** Extra absolute paths in the image that are symlinks to `path`. */
  links?: readonly string[];
}

const desktopDir = join(import.meta.dirname, "../desktop");

/**
 * The bases. Measured on a 2-core machine against deb.debian.org, cold: node (Node 18.20) 62 s of debootstrap + 8 s
 * of commit, 223 MB after the cleanup below; python (3.11) 77 s + 9 s, 173 MB (debootstrap alone varied from 44 to
 * 77 s with the mirror). Each is built only the first time a FROM names it; cached, `ensureBase` takes 0.1 s.
 */
export const bases: readonly BaseSpec[] = [
  { repo: "agentvm/node", tag: "bookworm", suite: "bookworm", include: ["nodejs"] },
  { repo: "agentvm/python", tag: "bookworm", suite: "bookworm", include: ["python3"] },
  { repo: "agentvm/debian", tag: "bookworm", suite: "bookworm", include: [] },
  {
    // A persistent desktop (docs/desktop.md): an X display at the agent's size, a window manager, a VNC server for the
    // guest's loopback (started by vnc-bridge on first use), and the helper the desktop API runs through the exec
    // path. Its entrypoint starts the display, then the image's CMD.
    repo: "agentvm/desktop",
    tag: "bookworm",
    suite: "bookworm",
    include: ["python3", "xvfb", "matchbox-window-manager", "x11vnc", "xdotool", "xterm", "x11-apps", "fonts-dejavu-core"],
    files: [
      { path: "/usr/lib/agentvm/desktop/session", source: join(desktopDir, "session.sh"), mode: 0o755, links: ["/usr/local/bin/agentvm-desktop-session"] },
      { path: "/usr/lib/agentvm/desktop/helper", source: join(desktopDir, "helper.py"), mode: 0o755 },
      // Compiled: a screenshot with no interpreter's start (call.c says what it does and why).
      { path: "/usr/lib/agentvm/desktop/call", source: join(desktopDir, "call.c"), mode: 0o755, compile: { flags: ["-lm"] } },
      { path: "/usr/lib/agentvm/desktop/vnc-bridge", source: join(desktopDir, "vnc-bridge.sh"), mode: 0o755 },
    ],
    // Xvfb depends on Mesa's GL drivers (and through them on LLVM and Z3: 160 MB of the 448); nothing here draws
    // with GL, so they go (a GL client would fail to load its driver).
    prune: ["/usr/lib/x86_64-linux-gnu/dri", "/usr/lib/x86_64-linux-gnu/libLLVM-15.so*", "/usr/lib/x86_64-linux-gnu/libz3.so*"],
    config: ["--env", "DISPLAY=:0", "--entrypoint", '["/usr/lib/agentvm/desktop/session"]', "--label", `${DESKTOP_LABEL}=1024x768`],
  },
];

/** Bump when what a base holds changes other than through the key's inputs (the cleanup, the config). */
const RECIPE = 1;
const KEY_LABEL = "agentvm.base-key";
const DEFAULT_MIRROR = "http://deb.debian.org/debian";

/** The base a FROM names (`agentvm/node:bookworm`, `localhost/agentvm/node`, …), or undefined when it is not one of ours. */
export function baseFor(ref: string): BaseSpec | undefined {
  const name = ref.replace(/^localhost\//, "").replace(/@.*$/, "");
  const colon = name.lastIndexOf(":");
  const [repo, tag] = colon > name.lastIndexOf("/") ? [name.slice(0, colon), name.slice(colon + 1)] : [name, "latest"];
  return bases.find((b) => b.repo === repo && (tag === b.tag || tag === "latest"));
}

/** The image references of FROM lines (`FROM [--platform=…] <image> [AS <stage>]`), continuation lines joined. */
export function fromImages(containerfile: string): string[] {
  const joined = containerfile.replace(/\\\r?\n/g, " ");
  const out: string[] = [];
  for (const line of joined.split(/\r?\n/)) {
    const words = line.trim().split(/\s+/);
    if (words[0]?.toUpperCase() !== "FROM") continue;
    const image = words.slice(1).find((w) => !w.startsWith("--"));
    if (image) out.push(image);
  }
  return out;
}

/** The full names a base is committed under (the first one carries the key label). */
export function baseNames(spec: BaseSpec): string[] {
  return [`localhost/${spec.repo}:${spec.tag}`, `localhost/${spec.repo}:latest`];
}

interface AptEntry {
  uri: string;
  suites: string[];
  components: string[];
}

/** One-line `deb [opts] uri suite components…` entries of a .list file. */
function parseList(text: string): AptEntry[] {
  const out: AptEntry[] = [];
  for (const raw of text.split("\n")) {
    const line = raw
      .replace(/#.*$/, "")
      .replace(/\[[^\]]*\]/, " ")
      .trim();
    const [type, uri, suite, ...components] = line.split(/\s+/);
    if (type === "deb" && uri && suite) out.push({ uri, suites: [suite], components });
  }
  return out;
}

/** deb822 stanzas of a .sources file (Types, URIs, Suites, Components, Enabled). */
function parseSources(text: string): AptEntry[] {
  const out: AptEntry[] = [];
  for (const stanza of text.split(/\n\s*\n/)) {
    const fields = new Map<string, string>();
    let last = "";
    for (const line of stanza.split("\n")) {
      if (line.startsWith("#")) continue;
      if (/^\s/.test(line) && last) {
        fields.set(last, `${fields.get(last)} ${line.trim()}`);
        continue;
      }
      const m = /^([\w-]+):\s*(.*)$/.exec(line);
      if (m) fields.set((last = m[1]!.toLowerCase()), m[2]!.trim());
    }
    const words = (k: string) => (fields.get(k) ?? "").split(/\s+/).filter(Boolean);
    if (!words("types").includes("deb") || fields.get("enabled")?.toLowerCase() === "no") continue;
    for (const uri of words("uris")) out.push({ uri, suites: words("suites"), components: words("components") });
  }
  return out;
}

/**
 * The Debian mirror this host's apt uses for `suite` (sources.list, sources.list.d/*.list and deb822 *.sources; other
 * files there, such as `*.disabled`, are not apt's either), else deb.debian.org. Security and updates suites are not
 * mirrors of the release and are skipped; so are URI schemes debootstrap cannot fetch from (`mirror+…`, `cdrom:`).
 */
export function aptMirror(suite: string, etcApt = "/etc/apt"): string {
  const entries: AptEntry[] = [];
  const read = (p: string) => {
    try {
      return readFileSync(p, "utf8");
    } catch {
      return "";
    }
  };
  entries.push(...parseList(read(join(etcApt, "sources.list"))));
  let names: string[] = [];
  try {
    names = readdirSync(join(etcApt, "sources.list.d")).sort();
  } catch {
    // no directory
  }
  for (const n of names) {
    if (n.endsWith(".list")) entries.push(...parseList(read(join(etcApt, "sources.list.d", n))));
    else if (n.endsWith(".sources")) entries.push(...parseSources(read(join(etcApt, "sources.list.d", n))));
  }
  const hit = entries.find((e) => e.suites.includes(suite) && /^(https?|file):/.test(e.uri) && (e.components.length === 0 || e.components.includes("main")));
  return (hit?.uri ?? DEFAULT_MIRROR).replace(/\/+$/, "");
}

function debootstrapVersion(bin: string): string {
  const r = spawnSync(bin, ["--version"], { encoding: "utf8" });
  return (r.stdout || r.stderr || "").trim() || "unknown";
}

/** What a base's root is debootstrapped from; its hash names the cache directory. */
export function baseKey(spec: BaseSpec, mirror: string, debootstrap: string): string {
  const inputs = { recipe: RECIPE, suite: spec.suite, variant: "minbase", include: [...spec.include].sort(), mirror, debootstrap, arch: "amd64" };
  return createHash("sha256").update(JSON.stringify(inputs)).digest("hex").slice(0, 32);
}

/**
 * The key the committed image carries: the root's key, plus our files' contents and the config when the base has
 * any (changing a helper recommits the image without debootstrapping again).
 */
export function imageKey(spec: BaseSpec, rootKey: string): string {
  if (!spec.files?.length && !spec.config?.length && !spec.prune?.length) return rootKey;
  const hash = createHash("sha256")
    .update(rootKey)
    .update(JSON.stringify([spec.config ?? [], spec.prune ?? []]));
  for (const f of spec.files ?? []) {
    hash.update(JSON.stringify([f.path, f.mode, f.links ?? [], f.compile ?? null])).update(readFileSync(f.source));
    if (f.compile) hash.update(gccVersion());
  }
  return `${rootKey.slice(0, 16)}${hash.digest("hex").slice(0, 16)}`;
}

/** Builds a compiled base file into `target` (gcc -static -O2), or AppError("internal") saying what failed. */
function compileFile(f: BaseFile & { compile: { flags: readonly string[] } }, target: string): void {
  const failed = compileStatic([f.source], target, f.compile.flags);
  if (failed?.missing) throw new AppError("internal", `a base's ${f.path} is compiled on this host: install gcc libc6-dev (apt-get install -y gcc libc6-dev)`);
  if (failed) throw new AppError("internal", `compiling ${f.path} from ${f.source} failed:\n${tailText(failed.stderr.split("\n"), 10)}`);
}

/** Removes a base's `prune` paths from a mounted root (a `*` in the last part matches any run of characters). */
function prunePaths(root: string, paths: readonly string[]): void {
  for (const p of paths) {
    const dir = dirname(p);
    const last = p.slice(dir.length + 1);
    if (!last.includes("*")) {
      rmSync(join(root, p), { recursive: true, force: true });
      continue;
    }
    const pattern = new RegExp(`^${last.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*")}$`);
    let names: string[] = [];
    try {
      names = readdirSync(join(root, dir));
    } catch {
      continue;
    }
    for (const n of names) if (pattern.test(n)) rmSync(join(root, dir, n), { recursive: true, force: true });
  }
}

/** Writes a base's own files into a mounted root (owned by root, their modes, their links). */
function addFiles(root: string, files: readonly BaseFile[]): void {
  for (const f of files) {
    const target = join(root, f.path);
    mkdirSync(dirname(target), { recursive: true });
    if (f.compile) compileFile({ ...f, compile: f.compile }, target);
    else writeFileSync(target, readFileSync(f.source));
    chmodSync(target, f.mode);
    for (const link of f.links ?? []) {
      mkdirSync(dirname(join(root, link)), { recursive: true });
      rmSync(join(root, link), { force: true });
      symlinkSync(f.path, join(root, link));
    }
  }
}

export interface BaseImage {
  spec: BaseSpec;
  /** `localhost/agentvm/node:bookworm`. */
  name: string;
  key: string;
  /** The debootstrapped root under the cache directory. */
  rootfs: string;
  /** Whether this call ran debootstrap (false: the cache had it). */
  built: boolean;
  /** Whether this call committed it into buildah's storage (false: storage had it under this key). */
  committed: boolean;
}

export interface EnsureBaseOptions {
  cacheDir: string;
  onEvent?: (e: BuildEvent) => void;
  signal?: AbortSignal;
  /** Where apt's sources are read (tests point it elsewhere). */
  etcApt?: string;
}

/** Unmounts whatever is mounted under `dir` (a debootstrap that was stopped leaves /proc and /sys mounted in its target). */
function unmountUnder(dir: string): void {
  let info = "";
  try {
    info = readFileSync("/proc/self/mountinfo", "utf8");
  } catch {
    return;
  }
  const unescapeOctal = (s: string) => s.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8)));
  const points = info
    .split("\n")
    .map((l) => unescapeOctal(l.split(" ")[4] ?? ""))
    .filter((p) => p.startsWith(`${dir}/`));
  for (const p of points.sort((a, b) => b.length - a.length)) spawnSync("umount", ["-l", p]);
}

/** Removes what a container image does not carry: downloaded packages, apt lists, device nodes, the host's name and DNS. */
function cleanRoot(root: string): void {
  const emptyDir = (d: string) => {
    for (const n of readdirSync(join(root, d))) rmSync(join(root, d, n), { recursive: true, force: true });
  };
  for (const n of readdirSync(join(root, "var/cache/apt/archives"))) if (n.endsWith(".deb")) rmSync(join(root, "var/cache/apt/archives", n));
  for (const n of readdirSync(join(root, "var/lib/apt/lists")))
    if (n !== "partial" && n !== "lock") rmSync(join(root, "var/lib/apt/lists", n), { recursive: true, force: true });
  emptyDir("dev"); // the guest mounts devtmpfs; buildah's RUN brings its own /dev
  // debootstrap copies these from the build host; the guest writes its own.
  for (const f of ["etc/hostname", "etc/resolv.conf"]) rmSync(join(root, f), { force: true });
}

/** debootstrap's lines about one package (`I: Retrieving libc6 2.36-9`, `I: Unpacking libc6:amd64...`): logged, not progress. */
const perPackage = /^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) [a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?( \S*\d\S*)?(\.\.\.)?$/;

async function debootstrap(bin: string, spec: BaseSpec, mirror: string, target: string, opts: EnsureBaseOptions): Promise<void> {
  const args = ["--variant=minbase", ...(spec.include.length > 0 ? [`--include=${spec.include.join(",")}`] : []), spec.suite, target, mirror];
  opts.onEvent?.({ type: "progress", phase: "base", text: `debootstrap ${args.join(" ")}` });
  const r = await run(bin, args, {
    keepLines: 30,
    env: { ...process.env, LC_ALL: "C", DEBIAN_FRONTEND: "noninteractive" },
    onLine: (line) => {
      opts.onEvent?.({ type: "log", line });
      if (line.startsWith("I: ") && !perPackage.test(line)) opts.onEvent?.({ type: "progress", phase: "base", text: line.slice(3) });
    },
    ...(opts.signal ? { signal: opts.signal } : {}),
  }).catch((err: unknown) => {
    unmountUnder(target);
    throw err;
  });
  unmountUnder(target);
  if (r.code !== 0)
    throw new AppError("internal", `the ${spec.repo}:${spec.tag} base could not be built (debootstrap from ${mirror} failed):\n${tailText(r.tail, 10)}`);
}

/** Copies a tree keeping everything (owners, modes, links, xattrs), reflinked where the filesystem can. */
async function copyTree(from: string, to: string, signal?: AbortSignal): Promise<void> {
  const r = await run("cp", ["-a", "--reflink=auto", `${from}/.`, `${to}/`], { keepLines: 5, ...(signal ? { signal } : {}) });
  if (r.code !== 0) throw new AppError("internal", `copying the base into buildah's container failed: ${tailText(r.tail, 3)}`);
}

/**
 * Makes sure the base exists in the cache and in buildah's storage under its names, building and committing it
 * when needed. Processes on this machine serialize on a lock per key: two builds at once debootstrap once.
 */
export async function ensureBase(spec: BaseSpec, opts: EnsureBaseOptions): Promise<BaseImage> {
  const tools = requireTools(["debootstrap", "buildah"]);
  const mirror = aptMirror(spec.suite, opts.etcApt);
  const key = baseKey(spec, mirror, debootstrapVersion(tools.debootstrap));
  const basesDir = join(opts.cacheDir, "bases");
  const dir = join(basesDir, key);
  const rootfs = join(dir, "rootfs");
  const [name] = baseNames(spec) as [string];
  mkdirSync(basesDir, { recursive: true });
  const release = await takeLock(join(basesDir, `${key}.lock`), {
    onWait: (pid) => opts.onEvent?.({ type: "progress", phase: "base", text: `waiting for process ${pid}, which is building ${spec.repo}:${spec.tag}` }),
    ...(opts.signal ? { signal: opts.signal } : {}),
  });
  try {
    let built = false;
    if (!existsSync(join(dir, "base.json"))) {
      const started = performance.now();
      const tmp = join(basesDir, `.tmp-${key}-${process.pid}`);
      unmountUnder(tmp);
      rmSync(tmp, { recursive: true, force: true });
      mkdirSync(tmp, { recursive: true });
      try {
        await debootstrap(tools.debootstrap, spec, mirror, join(tmp, "rootfs"), opts);
        cleanRoot(join(tmp, "rootfs"));
        const seconds = (performance.now() - started) / 1000;
        writeFileSync(
          join(tmp, "base.json"),
          `${JSON.stringify({ repo: spec.repo, tag: spec.tag, key, mirror, suite: spec.suite, include: spec.include, seconds: Math.round(seconds * 10) / 10 }, null, 2)}\n`,
        );
        rmSync(dir, { recursive: true, force: true });
        renameSync(tmp, dir);
      } finally {
        unmountUnder(tmp);
        rmSync(tmp, { recursive: true, force: true });
      }
      built = true;
      removeOtherKeys(basesDir, spec, key);
      opts.onEvent?.({ type: "progress", phase: "base", text: `${spec.repo}:${spec.tag} built in ${((performance.now() - started) / 1000).toFixed(1)} s` });
    }

    const setup = buildahSetup(opts.cacheDir);
    const present = await buildahImageLabels(setup, name);
    const labelKey = imageKey(spec, key);
    let committed = false;
    if (present?.labels[KEY_LABEL] !== labelKey) {
      opts.onEvent?.({ type: "progress", phase: "base", text: `committing ${name} into buildah's storage` });
      const id = await buildahCommitScratch(setup, {
        fill: async (root) => {
          await copyTree(rootfs, root, opts.signal);
          prunePaths(root, spec.prune ?? []);
          addFiles(root, spec.files ?? []);
        },
        config: [
          "--env",
          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
          "--env",
          "LANG=C.UTF-8",
          "--label",
          `${KEY_LABEL}=${labelKey}`,
          "--label",
          `agentvm.base=${spec.repo}:${spec.tag}`,
          "--workingdir",
          "/",
          ...(spec.config ?? []),
        ],
        names: baseNames(spec),
      });
      committed = true;
      // The image the names pointed to before (an older key): vfs keeps a whole copy of it otherwise.
      if (present?.id && present.id !== id) await buildahRemoveImage(setup, present.id).catch(() => undefined);
    }
    return { spec, name, key, rootfs, built, committed };
  } finally {
    release();
  }
}

/** Removes cached roots of the same base built from other inputs (an older debootstrap, another mirror). */
function removeOtherKeys(basesDir: string, spec: BaseSpec, key: string): void {
  for (const n of readdirSync(basesDir)) {
    if (n === key || n.startsWith(".") || n.endsWith(".lock")) continue;
    try {
      const meta = JSON.parse(readFileSync(join(basesDir, n, "base.json"), "utf8")) as { repo?: string; tag?: string };
      if (meta.repo === spec.repo && meta.tag === spec.tag) rmSync(join(basesDir, n), { recursive: true, force: true });
    } catch {
      // not a base directory
    }
  }
}
