// The artifact store as a directory (a local disk, or NFS/EFS/CephFS shared by hosts): blobs by digest, a verified local cache.
//
// Layout: `<root>/blobs/sha256/<ab>/<hex>` (ab: the digest's first two hex digits), written as `<root>/tmp/<random>`
// and hard-linked into place. What it relies on, which any POSIX filesystem, NFS (v3 and v4), EFS and CephFS give:
// - `link()` (or `rename()` where a filesystem has no hard links) within one filesystem is atomic: a name under
//   blobs/ either does not exist or names a complete file. link() never replaces: two writers of the same digest both
//   succeed, the second sees EEXIST (as does an NFS retransmission of our own link), and either way the blob is there.
// - Close-to-open consistency: the writer fsyncs and closes the file before linking it, so a host that opens the
//   name afterwards reads every byte. Nothing needs locks, leases or fcntl on the shared filesystem.
// - Every read hashes what it reads and refuses a mismatch, so a torn or bit-rotted blob (or cache entry) is never used.
// A writer killed part way leaves only its file under tmp/ (`sweepTemps` removes old ones), never a blob.
//
// Sparse files (a RAM file, a disk image: mostly zeros) stay sparse: all-zero 64 KiB blocks are not written, on put
// (into the store) nor on get (into the cache and the destination), and the file is truncated to its size, so the
// zeros are holes. Hashing happens in the same read pass as the copy, and the holes of the file read are not read at
// all (SEEK_DATA/SEEK_HOLE, extents.ts): their zeros are hashed from memory.
import { createHash, randomBytes } from "node:crypto";
import { link, mkdir, open, readdir, rename, rm, stat, utimes, type FileHandle } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { fsyncPath } from "../drivers/common/snapshot-files.ts";
import { dataMap } from "./extents.ts";
import { digestHex, type ArtifactStore, type PutResult, type StoredBlob } from "./store.ts";

/** A zero block of this size is left a hole. 64 KiB: what filesystems allocate in at most (ext4/xfs 4 KiB, NFS rsize larger). */
const BLOCK = 64 * 1024;
/** Bytes read per call. */
const CHUNK = 64 * BLOCK;
const ZERO = Buffer.alloc(BLOCK);
const ZERO_CHUNK = Buffer.alloc(CHUNK);

export interface DirArtifactStoreOptions {
  /** The store's directory (created when missing). */
  root: string;
  /** A host-local cache of blobs read (same layout); every use of it is verified too. Absent: no cache. */
  cacheDir?: string;
  log?: Logger;
}

export interface DirArtifactStore extends ArtifactStore {
  readonly root: string;
  /** Where a blob lives in the store (whether or not it is there). */
  blobPath(digest: string): string;
  /**
   * Removes files under `<root>/tmp` older than `olderThanMs` at `nowMs` (wall clock): the leftovers of writers that
   * died part way. Other hosts may be writing there right now, so only age tells a dead writer's file from a live one.
   */
  sweepTemps(olderThanMs: number, nowMs: number): Promise<string[]>;
  /** Every blob in the store, with its size and modification time (for the garbage collector, gc.ts). */
  list(): AsyncGenerator<StoredBlob>;
  /** The blob's current modification time (undefined: gone). */
  mtimeOf(digest: string): Promise<number | undefined>;
  /** Removes a blob (the garbage collector's; nothing else removes blobs). Answers its bytes, 0 when it was gone. */
  remove(digest: string): Promise<number>;
}

/** Thrown inside when bytes do not hash to the name they were read under. */
class DigestMismatch extends Error {
  readonly actual: string;
  constructor(actual: string) {
    super(`bytes hash to sha256:${actual}`);
    this.actual = actual;
  }
}

const errno = (err: unknown) => (err as NodeJS.ErrnoException).code ?? "";
/** A filesystem that has no hard links (some FUSE and SMB mounts): rename into place instead. */
const NO_LINK = new Set(["EPERM", "ENOTSUP", "EOPNOTSUPP", "ENOSYS", "EXDEV"]);

export function createDirArtifactStore(opts: DirArtifactStoreOptions): DirArtifactStore {
  const log = opts.log ?? silentLogger;
  const tmpDir = join(opts.root, "tmp");
  const pathIn = (base: string, hex: string) => join(base, "sha256", hex.slice(0, 2), hex);
  const blobOf = (hex: string) => pathIn(join(opts.root, "blobs"), hex);

  async function ensureDir(dir: string): Promise<void> {
    // mkdir answers the first directory it made: the one whose parent must be synced for the new entries to persist.
    const first = await mkdir(dir, { recursive: true });
    if (first) await fsyncPath(dirname(first));
  }

  /**
   * Copies `src` into `sinks` in one pass (zero blocks as holes), hashing it; checks the hash against `expect`. A
   * regular file's holes (extents.ts) are not read at all: their zeros are hashed from memory.
   */
  async function copy(src: string, sinks: FileHandle[], expect?: string): Promise<{ hex: string; bytes: number; written: number }> {
    const input = await open(src, "r");
    let reading: Promise<unknown> = Promise.resolve();
    try {
      const hash = createHash("sha256");
      const st = await input.stat();
      const mapped = st.isFile() ? await dataMap(src) : undefined;
      // The map is of the path, the copy of the open file: used only when they agree (the store's inputs do not change).
      const map = mapped?.size === st.size ? mapped : undefined;
      let written = 0;
      const writeNonZero = async (chunk: Buffer, at: number) => {
        // Runs of non-zero blocks are written with one call each; zero blocks are skipped (holes after the truncate).
        let run = -1;
        for (let off = 0; ; off += BLOCK) {
          const end = Math.min(off + BLOCK, chunk.length);
          const zero = off >= chunk.length || chunk.subarray(off, end).equals(ZERO.subarray(0, end - off));
          if (!zero && run < 0) run = off;
          if (zero && run >= 0) {
            const part = chunk.subarray(run, Math.min(off, chunk.length));
            for (const s of sinks) await s.write(part, 0, part.length, at + run);
            written += part.length;
            run = -1;
          }
          if (off >= chunk.length) break;
        }
      };
      // Two buffers: the next read (on the thread pool) runs while this chunk is hashed and written.
      const bufs = [Buffer.allocUnsafe(CHUNK), Buffer.allocUnsafe(CHUNK)] as const;
      /** Reads `[start, end)` (end Infinity: sequentially to the end, which a pipe can do too); answers where it stopped. */
      const readRange = async (start: number, end: number): Promise<number> => {
        let pos = start;
        let turn = 0;
        const readAt = (p: number) => {
          const r = input.read(bufs[turn]!, 0, Math.min(CHUNK, end - p), map ? p : null);
          r.catch(() => {}); // awaited below; marked handled so a failure while a write is awaited is not "unhandled"
          reading = r;
          return r;
        };
        let next = pos < end ? readAt(pos) : undefined;
        while (next) {
          const { bytesRead } = await next;
          if (bytesRead === 0) break;
          const chunk = bufs[turn]!.subarray(0, bytesRead);
          const at = pos;
          pos += bytesRead;
          turn ^= 1;
          next = pos < end ? readAt(pos) : undefined;
          hash.update(chunk);
          await writeNonZero(chunk, at);
        }
        return pos;
      };
      const hashZeros = (n: number) => {
        for (let left = n; left > 0; left -= CHUNK) hash.update(ZERO_CHUNK.subarray(0, Math.min(left, CHUNK)));
      };
      let pos = 0;
      if (!map) pos = await readRange(0, Infinity);
      else {
        for (const [start, end] of map.ranges) {
          hashZeros(start - pos);
          if ((await readRange(start, end)) !== end) throw new Error(`${src} became shorter while it was read`);
          pos = end;
        }
        hashZeros(map.size - pos);
        pos = map.size;
      }
      const hex = hash.digest("hex");
      if (expect !== undefined && hex !== expect) throw new DigestMismatch(hex);
      for (const s of sinks) {
        await s.truncate(pos);
        await s.sync();
      }
      return { hex, bytes: pos, written };
    } finally {
      await reading.catch(() => {}); // a read still in flight when a write failed
      await input.close();
    }
  }

  /** A new file beside `path` (same directory: the rename into place stays on one filesystem). */
  async function tempBeside(path: string): Promise<{ path: string; fh: FileHandle }> {
    await ensureDir(dirname(path));
    const tmp = join(dirname(path), `.${basename(path)}.tmp-${randomBytes(6).toString("hex")}`);
    return { path: tmp, fh: await open(tmp, "wx", 0o644) };
  }

  /** Copies the verified blob at `src` to every target (each via a temp name, renamed once the whole blob checked out). */
  async function deliver(src: string, hex: string, targets: string[]): Promise<void> {
    const temps: { path: string; fh: FileHandle }[] = [];
    let done = false;
    try {
      for (const t of targets) temps.push(await tempBeside(t));
      await copy(
        src,
        temps.map((t) => t.fh),
        hex,
      );
      for (const t of temps) await t.fh.close();
      for (const [i, t] of temps.entries()) {
        await rename(t.path, targets[i]!);
        await fsyncPath(dirname(targets[i]!));
      }
      done = true;
    } finally {
      if (!done) {
        for (const t of temps) {
          await t.fh.close().catch(() => {});
          await rm(t.path, { force: true });
        }
      }
    }
  }

  return {
    kind: "dir",
    root: opts.root,
    blobPath: (digest) => blobOf(digestHex(digest)),

    async put(path): Promise<PutResult> {
      await ensureDir(tmpDir);
      const tmp = join(tmpDir, `${process.pid}-${randomBytes(8).toString("hex")}`);
      const out = await open(tmp, "wx", 0o444);
      let hex: string;
      let bytes: number;
      let written: number;
      try {
        ({ hex, bytes, written } = await copy(path, [out]));
      } catch (err) {
        await out.close().catch(() => {});
        await rm(tmp, { force: true });
        throw err;
      }
      await out.close();
      const blob = blobOf(hex);
      let added = true;
      try {
        await ensureDir(dirname(blob));
        try {
          await link(tmp, blob);
        } catch (err) {
          if (errno(err) === "EEXIST") added = false;
          else if (!NO_LINK.has(errno(err))) throw err;
          else if (await exists(blob)) added = false;
          else await rename(tmp, blob); // same bytes under the same name: a concurrent rename over it is harmless
        }
        if (added) await fsyncPath(dirname(blob));
        // The same bytes again: the blob is touched, so the garbage collector, which spares blobs put within its grace
        // period, cannot remove it between this put and the row that will reference it (gc.ts).
        else await utimes(blob, new Date(), new Date()).catch(() => undefined);
      } finally {
        await rm(tmp, { force: true });
      }
      return { digest: `sha256:${hex}`, bytes, added, written: added ? written : 0 };
    },

    async get(digest, dest, getOpts = {}) {
      const hex = digestHex(digest);
      const blob = blobOf(hex);
      const cached = opts.cacheDir && getOpts.cache !== false ? pathIn(opts.cacheDir, hex) : undefined;
      if (cached && (await exists(cached))) {
        try {
          await deliver(cached, hex, [dest]);
          return;
        } catch (err) {
          if (!(err instanceof DigestMismatch)) throw err;
          log.warn("artifact cache entry is corrupt: removed, reading the store", { digest, path: cached, actual: `sha256:${err.actual}` });
          await rm(cached, { force: true });
        }
      }
      try {
        await deliver(blob, hex, cached ? [cached, dest] : [dest]);
      } catch (err) {
        if (errno(err) === "ENOENT" && !(await exists(blob))) throw new AppError("not_found", `artifact ${digest} is not in the store`, { cause: err });
        if (err instanceof DigestMismatch) {
          throw new AppError("internal", `artifact ${digest} is corrupt in the store (${blob}): its bytes hash to sha256:${err.actual}`, {
            details: { digest, actual: `sha256:${err.actual}` },
          });
        }
        throw err;
      }
    },

    has: (digest) => exists(blobOf(digestHex(digest))),

    async *list() {
      const top = join(opts.root, "blobs", "sha256");
      for (const prefix of await readdir(top).catch(() => [] as string[])) {
        if (!/^[0-9a-f]{2}$/.test(prefix)) continue;
        for (const hex of await readdir(join(top, prefix)).catch(() => [] as string[])) {
          if (!/^[0-9a-f]{64}$/.test(hex) || !hex.startsWith(prefix)) continue; // temps of a rename-only filesystem, strays
          const st = await stat(join(top, prefix, hex)).catch(() => undefined);
          if (st?.isFile()) yield { digest: `sha256:${hex}`, bytes: st.size, mtimeMs: st.mtimeMs };
        }
      }
    },

    async mtimeOf(digest) {
      return (await stat(blobOf(digestHex(digest))).catch(() => undefined))?.mtimeMs;
    },

    async remove(digest) {
      const blob = blobOf(digestHex(digest));
      const st = await stat(blob).catch(() => undefined);
      if (!st) return 0;
      await rm(blob, { force: true });
      return st.size;
    },

    async sweepTemps(olderThanMs, nowMs) {
      let names: string[];
      try {
        names = await readdir(tmpDir);
      } catch (err) {
        if (errno(err) === "ENOENT") return [];
        throw err;
      }
      const removed: string[] = [];
      for (const name of names) {
        const st = await stat(join(tmpDir, name)).catch(() => undefined);
        if (!st || nowMs - st.mtimeMs < olderThanMs) continue;
        await rm(join(tmpDir, name), { force: true });
        removed.push(name);
      }
      return removed;
    },
  };
}

async function exists(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isFile();
  } catch (err) {
    if (errno(err) === "ENOENT") return false;
    throw err;
  }
}
