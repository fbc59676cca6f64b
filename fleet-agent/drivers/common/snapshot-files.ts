// Snapshot files on disk, for every driver that keeps snapshots: checksums, fsync, and the JSON manifest that is a
// snapshot's commit point (written under a temporary name, synced, renamed into place, directory synced), read back
// with a reason when it cannot be used. What a manifest holds and which data files it names is each driver's.
//
// Before, qemu and firecracker each had these with small differences: sha256 answered {sha256, bytes} (qemu) or the
// hex digest alone (firecracker), read in 4 MiB or 1 MiB chunks; qemu did not sync the directory before the
// manifest's rename (so the data file's rename could reach the disk after the manifest naming it), firecracker did;
// an unreadable manifest threw (qemu) or answered a problem (firecracker). Kept: {sha256, bytes} in 4 MiB chunks
// with an optional abort signal, the directory synced before and after the rename, and a problem string.
import { createHash, randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { open, readdir, readFile, rename, rm } from "node:fs/promises";
import { dirname, join } from "node:path";

export async function sha256File(path: string, signal?: AbortSignal): Promise<{ sha256: string; bytes: number }> {
  const hash = createHash("sha256");
  let bytes = 0;
  const stream = createReadStream(path, { highWaterMark: 4 << 20, ...(signal ? { signal } : {}) });
  for await (const chunk of stream) {
    hash.update(chunk as Buffer);
    bytes += (chunk as Buffer).length;
  }
  return { sha256: hash.digest("hex"), bytes };
}

/** fsync of a file or a directory (a directory's sync makes the renames in it durable). */
export async function fsyncPath(path: string): Promise<void> {
  const fh = await open(path, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** A generation written and synced beside its file, in effect once `commit` has renamed it into place. */
export interface StagedGeneration {
  generation: string;
  /** Renames it into place and syncs the directory: from then on it is the file's generation. */
  commit(): Promise<void>;
}

/**
 * A new generation for `file`, written and synced as `<file>.next` but not yet in effect: a crash before `commit`
 * leaves the old generation, and so whatever was recorded against it (a snapshot) still valid. A wake stages while
 * QEMU starts and loads, and commits just before `cont`: only a guest that may run moves the generation on.
 */
export async function stageGeneration(file: string): Promise<StagedGeneration> {
  const generation = `${Date.now()}-${randomBytes(8).toString("hex")}`;
  const next = `${file}.next`;
  const fh = await open(next, "w");
  try {
    await fh.writeFile(`${generation}\n`);
    await fh.sync();
  } finally {
    await fh.close();
  }
  return {
    generation,
    async commit() {
      await rename(next, file);
      await fsyncPath(dirname(file));
    },
  };
}

/**
 * Writes a new random generation into `file` (synced, renamed into place, its directory synced) and answers it: what
 * a snapshot's manifest records of a file the guest writes (its disk, its RAM), so a snapshot taken before the next
 * generation never pairs with the file again.
 */
export async function writeGeneration(file: string): Promise<string> {
  const staged = await stageGeneration(file);
  await staged.commit();
  return staged.generation;
}

/**
 * Makes `manifest` the committed one at `path`: written to `<path>.tmp` and synced, the directory synced (renames
 * of the data files it names are durable first), renamed into place, the directory synced again. A crash at any
 * point leaves the old manifest or the new one. `alongside`: the fsync of a data file the manifest names, run
 * meanwhile (one journal commit serves both); the rename waits for it.
 */
export async function commitManifest(path: string, manifest: unknown, alongside?: Promise<unknown>): Promise<void> {
  const tmp = `${path}.tmp`;
  const written = (async () => {
    const fh = await open(tmp, "w");
    try {
      await fh.writeFile(`${JSON.stringify(manifest, null, 2)}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
  })();
  // Both complete (and the first failure rejects) before the rename: the manifest never names data not yet durable.
  await Promise.all([written, alongside]);
  await fsyncPath(dirname(path));
  await rename(tmp, path);
  await fsyncPath(dirname(path));
}

/**
 * Publishes a directory built under a temporary name (a checkpoint): its manifest committed inside it, then the
 * directory renamed to `dir` and its parent synced. A crash before the rename leaves only the temporary directory.
 */
export async function publishDirectory(tmp: string, manifestPath: string, manifest: unknown, dir: string): Promise<void> {
  await commitManifest(manifestPath, manifest);
  await rename(tmp, dir);
  await fsyncPath(dirname(dir));
}

/**
 * The committed manifest at `path`: `{}` when there is none, `{problem}` when it cannot be read or is not one this
 * driver wrote (`valid` says which), else `{manifest}`.
 */
export async function readManifest<T>(path: string, valid: (m: Partial<T>) => boolean): Promise<{ manifest?: T; problem?: string }> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return {};
    return { problem: `snapshot manifest unreadable: ${(err as Error).message}` };
  }
  let m: unknown;
  try {
    m = JSON.parse(text);
  } catch {
    return { problem: "snapshot manifest is not valid JSON" };
  }
  if (typeof m !== "object" || m === null || !valid(m as Partial<T>)) return { problem: "snapshot manifest has an unknown format" };
  return { manifest: m as T };
}

/** Removes the files in `dir` that `stale` picks (partial snapshots, generations no manifest names); answers their names. */
export async function removeFiles(dir: string, stale: (name: string) => boolean): Promise<string[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    if (!stale(name)) continue;
    await rm(join(dir, name), { force: true });
    removed.push(name);
  }
  return removed;
}
