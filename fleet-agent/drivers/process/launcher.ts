// The host build of the image launcher (fleet-agent/guest/launch.c) for the process driver: compiled once with
// `gcc -static -O2` into a cache directory, named by the hash of its source, safe when several VMs (or fleet-agents)
// boot at once.
//
// Concurrency: within a process one compile per cache path is shared (a map of promises); across processes each
// compiles to its own temporary name and renames it into place. A rename replaces atomically, so whoever finishes
// last installs an identical file and nobody ever executes a half-written one.
import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { constants } from "node:fs";
import { access, mkdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { launchSource } from "../../guest/launch-spec.ts";

const building = new Map<string, Promise<string>>();

/** `<cacheDir>/launch-<first 16 hex of the source's sha256>`, built when absent; answers its path. */
export async function ensureLauncher(cacheDir: string, opts: { source?: string; cc?: string } = {}): Promise<string> {
  const source = opts.source ?? launchSource;
  const hash = createHash("sha256")
    .update(await readFile(source))
    .digest("hex")
    .slice(0, 16);
  const binary = join(cacheDir, `launch-${hash}`);
  if (await executable(binary)) return binary;
  let pending = building.get(binary);
  if (!pending) {
    pending = compile(source, binary, opts.cc ?? "gcc").finally(() => building.delete(binary));
    building.set(binary, pending);
  }
  return pending;
}

async function compile(source: string, binary: string, cc: string): Promise<string> {
  await mkdir(join(binary, ".."), { recursive: true });
  const tmp = `${binary}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    await new Promise<void>((resolve, reject) => {
      execFile(cc, ["-static", "-O2", "-o", tmp, source], { timeout: 120_000 }, (err, _stdout, stderr) => {
        if (!err) return resolve();
        const why =
          (err as NodeJS.ErrnoException).code === "ENOENT"
            ? `${cc} is not installed (apt-get install gcc libc6-dev)`
            : stderr.trim().slice(-600) || err.message;
        reject(new Error(`cannot build the image launcher from ${source}: ${why}`));
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
