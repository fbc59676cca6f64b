// The artifact store hosts share (snapshots, disks): content-addressed blobs, put once under their digest, read back verified.
import { AppError } from "../../lib/errors.ts";

/** `sha256:<64 hex>`: the one digest form blobs are named by. */
export const DIGEST_PATTERN = /^sha256:([0-9a-f]{64})$/;

export interface PutResult {
  digest: string;
  bytes: number;
  /** True when this put stored the blob; false when it was there already (deduplicated, or a concurrent writer won). */
  added: boolean;
  /** Bytes this put wrote into the store: 0 when not `added`; a sparse file's holes (all-zero blocks) are not written. */
  written: number;
}

export interface ArtifactStore {
  /** `dir` (dir-store.ts); an object-storage backend would be `s3`. */
  readonly kind: string;
  /** Puts a file's bytes under their digest ("sha256:<hex>"), unless already there; answers the digest and size. */
  put(path: string): Promise<PutResult>;
  /**
   * Writes the blob to `dest` (temp name in dest's dir, then rename), verifying its digest as it reads; a local cache
   * (if configured) is filled and used, and verified too. AppError `not_found` when the store has no such blob,
   * `internal` (details `{digest, actual}`) when the store's copy does not hash to its name; `dest` is then untouched.
   */
  get(digest: string, dest: string, opts?: GetOptions): Promise<void>;
  has(digest: string): Promise<boolean>;
}

export interface GetOptions {
  /** false: not through the host's local cache (a file the caller keeps itself, such as an image's root filesystem). */
  cache?: boolean;
}

/** A blob as the store's garbage collector sees it. */
export interface StoredBlob {
  digest: string;
  bytes: number;
  /** Its modification time: when it was put, or last put again (a put of bytes already there touches it). */
  mtimeMs: number;
}

/** The hex part of a digest; AppError `bad_request` for anything that is not `sha256:<64 hex>` (it names a path). */
export function digestHex(digest: string): string {
  const m = DIGEST_PATTERN.exec(digest);
  if (!m) throw new AppError("bad_request", `"${digest.slice(0, 80)}" is not an artifact digest (sha256:<64 hex>)`);
  return m[1]!;
}
