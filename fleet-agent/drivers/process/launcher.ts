// Host builds of the guest's C programs for the process driver: the image launcher (fleet-agent/guest/launch.c) and
// the exec server (fleet-agent/guest/guest-exec/), each compiled once with `gcc -static -O2` into a cache directory,
// named by the hash of its sources and headers, safe when several VMs (or fleet-agents) boot at once.
//
// Concurrency: within a process one compile per cache path is shared (a map of promises); across processes each
// compiles to its own temporary name and renames it into place. A rename replaces atomically, so whoever finishes
// last installs an identical file and nobody ever executes a half-written one.
import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { constants } from "node:fs";
import { access, mkdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { guestExecFiles } from "../../guest/guest-exec/sources.ts";
import { launchSource } from "../../guest/launch-spec.ts";

const building = new Map<string, Promise<string>>();

/** `<cacheDir>/launch-<first 16 hex of the source's sha256>`, built when absent; answers its path. */
export async function ensureLauncher(cacheDir: string, opts: { source?: string; cc?: string } = {}): Promise<string> {
  const source = opts.source ?? launchSource;
  // launch.c's header is part of it when it is the real launcher (a test's stand-in source has none).
  const headers = opts.source ? [] : [join(launchSource, "..", "launch-common.h")];
  return ensureHostBinary(cacheDir, { name: "launch", sources: [source], headers, what: "the image launcher", cc: opts.cc });
}

/** The exec server for the host (`<cacheDir>/guest-exec-<hash>`), built when absent. */
export function ensureGuestExec(cacheDir: string, opts: { cc?: string } = {}): Promise<string> {
  const { sources, headers } = guestExecFiles();
  return ensureHostBinary(cacheDir, { name: "guest-exec", sources, headers, what: "the exec server", cc: opts.cc });
}

/** `<cacheDir>/<name>-<first 16 hex of the sha256 of its sources and headers>`, built when absent; answers its path. */
export async function ensureHostBinary(
  cacheDir: string,
  b: { name: string; sources: string[]; headers?: string[]; what: string; cc?: string | undefined },
): Promise<string> {
  const hash = createHash("sha256");
  for (const f of [...b.sources, ...(b.headers ?? [])]) hash.update(await readFile(f));
  const binary = join(cacheDir, `${b.name}-${hash.digest("hex").slice(0, 16)}`);
  if (await executable(binary)) return binary;
  let pending = building.get(binary);
  if (!pending) {
    pending = compile(b.sources, binary, b.cc ?? "gcc", b.what).finally(() => building.delete(binary));
    building.set(binary, pending);
  }
  return pending;
}

async function compile(sources: string[], binary: string, cc: string, what: string): Promise<string> {
  await mkdir(join(binary, ".."), { recursive: true });
  const tmp = `${binary}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    await new Promise<void>((resolve, reject) => {
      execFile(cc, ["-static", "-O2", "-o", tmp, ...sources], { timeout: 120_000 }, (err, _stdout, stderr) => {
        if (!err) return resolve();
        const why =
          (err as NodeJS.ErrnoException).code === "ENOENT"
            ? `${cc} is not installed (apt-get install gcc libc6-dev)`
            : stderr.trim().slice(-600) || err.message;
        reject(new Error(`cannot build ${what} from ${sources.join(" ")}: ${why}`));
      });
    });
    await rename(tmp, binary);
  } finally {
    await rm(tmp, { force: true });
  }
  return binary;
}

async function executable(path: string): Promise<boolean> {
  try {
    await access(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}
