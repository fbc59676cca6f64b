// A host's identity on its own disk: the secret it made at its first start (what proves to the hosts table it is the host that registered) and the lock that keeps a second process off its data directory.
import { createHash, randomBytes } from "node:crypto";
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../lib/errors.ts";
import { tryLock } from "../lib/node-lock.ts";

/** What a started host holds until it stops: the hash it registers with, and the lock on its directory. */
export interface HostIdentity {
  hostId: string;
  /** sha256 (hex) of the host's secret: what `hosts.secret_hash` holds. The secret itself never leaves the file. */
  secretHash: string;
  /** Releases the lock on the host's directory (the secret stays: it is the host's for good). */
  release(): void;
}

/** A host id names a directory under `<dataDir>/hosts`: letters, digits, `_`, `-` and `.` only. */
export function checkHostId(hostId: string): string {
  if (!/^[A-Za-z0-9_.-]{1,100}$/.test(hostId) || hostId === "." || hostId === "..") {
    throw new AppError("bad_request", `configuration: HOST_ID "${hostId}" must be 1–100 letters, digits, "_", "-" or "." (it names a directory)`);
  }
  return hostId;
}

export function hostSecretPath(dataDir: string, hostId: string): string {
  return join(dataDir, "hosts", hostId, "host-secret");
}

export function hostLockPath(dataDir: string, hostId: string): string {
  return join(dataDir, "hosts", hostId, "host.lock");
}

export function secretHashOf(secret: string): string {
  return createHash("sha256").update(secret).digest("hex");
}

/**
 * Takes the lock on the host's directory, then reads its secret (made now at the first start). A live process that
 * holds the lock is a second host on the same data directory: refused with `conflict`, nothing touched.
 */
export function openHostIdentity(dataDir: string, hostId: string): HostIdentity {
  checkHostId(hostId);
  mkdirSync(join(dataDir, "hosts", hostId), { recursive: true });
  const release = lockHostDir(dataDir, hostId);
  try {
    return { hostId, secretHash: secretHashOf(ensureHostSecret(dataDir, hostId)), release };
  } catch (err) {
    release();
    throw err;
  }
}

/** The host's secret: 32 random bytes, base64url, in a mode-0600 file written under a temporary name and renamed into place. */
export function ensureHostSecret(dataDir: string, hostId: string): string {
  const path = hostSecretPath(dataDir, hostId);
  let text: string | undefined;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
  }
  if (text === undefined) {
    const secret = randomBytes(32).toString("base64url");
    const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
    writeDurably(tmp, `${secret}\n`);
    renameSync(tmp, path);
    return secret;
  }
  const secret = text.trim();
  if (!/^[A-Za-z0-9_-]{43}$/.test(secret)) {
    throw new AppError(
      "conflict",
      `the host secret in ${path} is not one this program wrote (expected 43 base64url characters); restore it from a backup, or, if the host's row should be claimed anew, delete the file and the row (delete from hosts where id='${hostId}')`,
    );
  }
  return secret;
}

/**
 * Takes `<dataDir>/hosts/<hostId>/host.lock` (lib/node-lock.ts: written whole, a dead process's lock taken over); one
 * of a live process is a second host on the same data directory, refused.
 */
export function lockHostDir(dataDir: string, hostId: string): () => void {
  const path = hostLockPath(dataDir, hostId);
  const got = tryLock(path);
  if ("release" in got) return got.release;
  throw new AppError(
    "conflict",
    got.holder > 0
      ? `host ${hostId}: another process (pid ${got.holder}) runs on the data directory ${dataDir} (it holds ${path}); stop it first, or give this one another DATA_DIR and HOST_ID`
      : `host ${hostId}: could not take ${path} (other processes keep taking it); is another fleet-agent starting on ${dataDir}?`,
  );
}

function writeDurably(path: string, text: string): void {
  const fd = openSync(path, "wx", 0o600);
  try {
    writeSync(fd, text);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}
