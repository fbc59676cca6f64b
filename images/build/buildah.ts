// Runs buildah on storage and configuration of our own: builds a Containerfile, exports an image as an OCI layout, manages base images.
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import { run, tailText, type RunOptions, type RunResult } from "./run.ts";
import { requireTools } from "./tools.ts";
import { pidAlive } from "../../lib/node-lock.ts";

/** Where a build's result is tagged until it is exported: `<BUILD_REPO>/<pid>-<random>:latest`. */
export const BUILD_REPO = "localhost/agentvm-build";

/** The timestamp of everything a build commits (image `created`, files of new layers): same inputs, same layers. */
export const BUILD_TIMESTAMP = 946684800; // 2000-01-01T00:00:00Z

export interface BuildStep {
  step: number;
  total: number;
  /** The instruction, prefixed with its stage in a multi-stage build (`[1/2] RUN …`). */
  text: string;
}

/** `STEP 3/5: RUN npm ci` or, in a multi-stage build, `[1/2] STEP 3/5: RUN npm ci`. */
export function parseStep(line: string): BuildStep | undefined {
  const m = /^(\[\d+\/\d+\] )?STEP (\d+)\/(\d+): (.*)$/.exec(line);
  if (!m) return undefined;
  return { step: Number(m[2]), total: Number(m[3]), text: `${m[1] ?? ""}${m[4]}` };
}

/**
 * Our own containers configuration, passed explicitly (flags and CONTAINERS_* variables), so that nothing in
 * /etc/containers changes what a build does: vfs storage under the cache directory (no kernel overlay, no fuse; its
 * own storage.conf and containers.conf), `docker.io` as the one unqualified-search registry (a short name like
 * `node:22-slim` means `docker.io/library/node:22-slim`; a host that reaches no registry fails that pull within a
 * second or two: DNS or connect error, retried once), and a policy accepting any image (nothing is signed; the input
 * is what the user gave us). One thing is still read from /etc: the short-name aliases of
 * /etc/containers/registries.conf.d (no flag or variable of buildah 1.28 moves that directory); they only map names
 * like `node` to their registry, as the search would.
 */
export interface BuildahSetup {
  bin: string;
  /** `<cacheDir>/buildah`: storage, configuration, and `active/` (one file per build running, named by its pid). */
  dir: string;
  /** Flags before the subcommand. */
  global: string[];
  /** `--signature-policy <file>` (bud, from, push, commit and pull take it; the global flags do not). */
  policy: string[];
  env: NodeJS.ProcessEnv;
}

function writeIfChanged(path: string, content: string): void {
  try {
    if (readFileSync(path, "utf8") === content) return;
  } catch {
    // absent
  }
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, content);
  renameSync(tmp, path); // atomic: a concurrent build reads the old file or the new one
}

export function buildahSetup(cacheDir: string, tmpDir?: string): BuildahSetup {
  const { buildah } = requireTools(["buildah"]);
  const dir = join(cacheDir, "buildah");
  const storage = join(dir, "storage");
  const runroot = join(dir, "run");
  const confDir = join(dir, "registries.d"); // signature lookaside configuration: none
  const tmp = tmpDir ?? join(dir, "tmp");
  for (const d of [storage, runroot, confDir, tmp]) mkdirSync(d, { recursive: true });
  const registries = join(dir, "registries.conf");
  writeIfChanged(registries, 'unqualified-search-registries = ["docker.io"]\nshort-name-mode = "permissive"\n');
  const policy = join(dir, "policy.json");
  writeIfChanged(policy, `${JSON.stringify({ default: [{ type: "insecureAcceptAnything" }] })}\n`);
  const storageConf = join(dir, "storage.conf");
  writeIfChanged(storageConf, `[storage]\ndriver = "vfs"\ngraphroot = ${JSON.stringify(storage)}\nrunroot = ${JSON.stringify(runroot)}\n`);
  const containersConf = join(dir, "containers.conf");
  writeIfChanged(containersConf, "# agentvm: defaults only (nothing from /etc/containers/containers.conf)\n");
  return {
    bin: buildah,
    dir,
    global: [
      "--storage-driver",
      "vfs",
      "--root",
      storage,
      "--runroot",
      runroot,
      "--registries-conf",
      registries,
      "--registries-conf-dir",
      confDir,
      "--short-name-alias-conf",
      join(dir, "short-name-aliases.conf"),
    ],
    policy: ["--signature-policy", policy],
    // TMPDIR: layers being committed or pushed are staged there (default /var/tmp), so they stay on our disk.
    env: {
      ...process.env,
      LC_ALL: "C",
      TMPDIR: tmp,
      CONTAINERS_STORAGE_CONF: storageConf,
      CONTAINERS_CONF: containersConf,
      CONTAINERS_REGISTRIES_CONF: registries,
      BUILDAH_ISOLATION: "chroot",
    },
  };
}

export function buildahRun(setup: BuildahSetup, args: string[], opts: RunOptions = {}): Promise<RunResult> {
  return run(setup.bin, [...setup.global, ...args], { ...opts, env: { ...setup.env, ...opts.env } });
}

async function must(setup: BuildahSetup, args: string[], what: string, opts: RunOptions = {}): Promise<RunResult> {
  const r = await buildahRun(setup, args, opts);
  if (r.code !== 0) throw new AppError("internal", `buildah ${what} failed: ${tailText(r.tail, 5)}`);
  return r;
}

export interface BuildOptions {
  contextDir: string;
  containerfile: string;
  /** Name the result is tagged with (removed again after export). */
  tag: string;
  iidfile: string;
  onLine?: (line: string) => void;
  signal?: AbortSignal;
}

/** Lines of buildah's output that say a base image could not be pulled (no registry, unknown name, no access). */
const pullFailure =
  /initializing source docker:|pinging container registry|no such host|i\/o timeout|connection refused|manifest unknown|requested access to the resource is denied|short-name .* did not resolve/;

/**
 * `buildah bud --isolation chroot` (no OCI runtime, no network namespace: RUN steps use the host's network and
 * DNS). Intermediate containers are removed even when a step fails (`--force-rm`). Answers the image id; a failed
 * build is `build_failed` with the tail of buildah's output.
 */
export async function buildahBuild(setup: BuildahSetup, opts: BuildOptions): Promise<string> {
  const args = [
    "bud",
    ...setup.policy,
    "--isolation",
    "chroot",
    "--format",
    "oci",
    "--pull=false",
    "--layers=false",
    "--force-rm",
    "--timestamp",
    String(BUILD_TIMESTAMP),
    "--retry",
    "1",
    "--retry-delay",
    "1s",
    "-f",
    opts.containerfile,
    "-t",
    opts.tag,
    "--iidfile",
    opts.iidfile,
    opts.contextDir,
  ];
  const r = await whileActive(setup, () =>
    buildahRun(setup, args, { keepLines: 60, ...(opts.onLine ? { onLine: opts.onLine } : {}), ...(opts.signal ? { signal: opts.signal } : {}) }),
  );
  if (r.code !== 0) throw buildFailure(r.tail, "this host");
  const id = readFileSync(opts.iidfile, "utf8")
    .trim()
    .replace(/^sha256:/, "");
  if (!/^[0-9a-f]{64}$/.test(id)) throw new AppError("internal", `buildah bud wrote no image id (${id || "empty"})`);
  return id;
}

/** A failed `buildah bud` as `build_failed`: what went wrong (a base that could not be pulled from `where`, or the build), then the tail of its output. */
export function buildFailure(lines: readonly string[], where: string): AppError {
  const pull = lines.find((l) => pullFailure.test(l));
  const from = lines.map(parseStep).find((s) => s?.text.replace(/^\[\d+\/\d+\] /, "").startsWith("FROM "));
  const summary = pull
    ? `the base image${from ? ` of ${from.text.replace(/^\[\d+\/\d+\] /, "")}` : ""} could not be pulled (is a registry reachable from ${where}? the local Debian bases are agentvm/node:bookworm, agentvm/python:bookworm and agentvm/debian:bookworm)`
    : "the Containerfile build failed";
  return new AppError("build_failed", `${summary}:\n${tailText([...lines], 20)}`);
}

/** Writes the image as an OCI layout `<dir>` with the reference `ref`, layers uncompressed (umoci reads them next; gzip would only cost time). */
export async function buildahPushLayout(setup: BuildahSetup, image: string, dir: string, ref: string, opts: RunOptions = {}): Promise<void> {
  await must(setup, ["push", ...setup.policy, "--disable-compression", "--quiet", image, `oci:${dir}:${ref}`], `push ${image}`, opts);
}

/** Pushes the image as an OCI archive or a `docker save` tarball (tests make archives this way). */
export async function buildahPushArchive(
  setup: BuildahSetup,
  image: string,
  file: string,
  format: "oci-archive" | "docker-archive",
  ref?: string,
): Promise<void> {
  await must(setup, ["push", ...setup.policy, "--quiet", image, `${format}:${file}${ref ? `:${ref}` : ""}`], `push ${image}`);
}

/** Removes an image name (the image itself once no name is left): vfs keeps a full copy of every layer. */
export async function buildahRemoveImage(setup: BuildahSetup, image: string): Promise<void> {
  const r = await buildahRun(setup, ["rmi", image]);
  if (r.code !== 0 && !r.tail.some((l) => /image not known|not found|no such image/i.test(l)))
    throw new AppError("internal", `buildah rmi ${image} failed: ${tailText(r.tail, 3)}`);
}

/** The labels of a local image, or undefined when storage has no image of that name. */
export async function buildahImageLabels(setup: BuildahSetup, image: string): Promise<{ id: string; labels: Record<string, string> } | undefined> {
  const r = await buildahRun(setup, ["inspect", "--type", "image", image]);
  if (r.code !== 0) return undefined;
  const info = JSON.parse(r.stdout) as { FromImageID?: string; OCIv1?: { config?: { Labels?: Record<string, string> } } };
  return { id: info.FromImageID ?? "", labels: info.OCIv1?.config?.Labels ?? {} };
}

export interface ScratchCommit {
  /** Fills the container's root directory (mounted at `root`). */
  fill: (root: string) => Promise<void>;
  /** `buildah config` flags (`--env`, `--label`, `--workingdir`, …). */
  config: string[];
  names: string[];
}

/** `buildah from scratch`, fill its mounted root, configure, commit under the first name and tag the others; answers the image id. */
export function buildahCommitScratch(setup: BuildahSetup, c: ScratchCommit): Promise<string> {
  return whileActive(setup, () => commitScratch(setup, c));
}

async function commitScratch(setup: BuildahSetup, c: ScratchCommit): Promise<string> {
  const container = (await must(setup, ["from", ...setup.policy, "--quiet", "scratch"], "from scratch")).stdout.trim();
  try {
    const root = (await must(setup, ["mount", container], "mount")).stdout.trim();
    await c.fill(root);
    await must(setup, ["config", ...c.config, container], "config");
    const [first, ...rest] = c.names;
    const id = (
      await must(setup, ["commit", ...setup.policy, "--quiet", "--format", "oci", "--timestamp", String(BUILD_TIMESTAMP), container, first!], "commit")
    ).stdout.trim();
    if (rest.length > 0) await must(setup, ["tag", id, ...rest], "tag");
    return id;
  } finally {
    await buildahRun(setup, ["rm", container]);
  }
}

/**
 * Runs `work` with a file in `active/` naming this process: while one exists, the working containers in storage may
 * be a live build's, and a sweep leaves them alone (containers carry no owner of their own).
 */
async function whileActive<T>(setup: BuildahSetup, work: () => Promise<T>): Promise<T> {
  const dir = join(setup.dir, "active");
  const file = join(dir, `${process.pid}-${Math.random().toString(36).slice(2, 10)}`);
  mkdirSync(dir, { recursive: true });
  writeFileSync(file, "");
  try {
    return await work();
  } finally {
    rmSync(file, { force: true });
  }
}

/**
 * Removes the results of builds whose process died between build and cleanup (tagged `<BUILD_REPO>/<pid>-…`, the pid
 * no longer running), and their working containers when no build is running on this storage; answers what it removed.
 * Call at start, next to the data directory's sweep.
 */
export async function sweepBuildah(cacheDir: string, isAlive: (pid: number) => boolean = pidAlive): Promise<string[]> {
  const setup = buildahSetup(cacheDir);
  const r = await buildahRun(setup, ["images", "--format", "{{.Name}}:{{.Tag}}"]);
  if (r.code !== 0) return [];
  const removed: string[] = [];
  for (const name of r.stdout.split("\n").map((l) => l.trim())) {
    const pid = Number(new RegExp(`^${BUILD_REPO}/(\\d+)-`).exec(name)?.[1]);
    if (!pid || pid === process.pid || isAlive(pid)) continue;
    await buildahRemoveImage(setup, name);
    removed.push(name);
  }
  // A build killed mid-step leaves its working container (a full copy of the rootfs under vfs). Containers carry no
  // owner, so they are removed only when no build of any process is running on this storage.
  const activeDir = join(setup.dir, "active");
  let running = 0;
  for (const f of safeList(activeDir)) {
    const pid = Number(f.split("-")[0]);
    if (pid && (pid === process.pid || isAlive(pid))) running++;
    else rmSync(join(activeDir, f), { force: true });
  }
  if (running === 0) {
    const c = await buildahRun(setup, ["containers", "--all", "--quiet"]);
    const ids =
      c.code === 0
        ? c.stdout
            .split("\n")
            .map((l) => l.trim())
            .filter(Boolean)
        : [];
    if (ids.length > 0 && (await buildahRun(setup, ["rm", ...ids])).code === 0) removed.push(...ids.map((id) => `container ${id}`));
  }
  return removed;
}

function safeList(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}
