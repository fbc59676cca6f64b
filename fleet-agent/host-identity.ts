// A host's identity on its own disk: the secret it made at its first start (what proves to the hosts table it is the host that registered) and the lock that keeps a second process off its data directory.
import { createHash, randomBytes } from "node:crypto";
import { closeSync, fsyncSync, linkSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../lib/errors.ts";
import { pidAlive } from "../lib/node-lock.ts";

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
    writeDurably(tmp, secret + "\n");
    renameSync(tmp, path);
    return secret;
  }
  const secret = text.trim();
  if (!/^[A-Za-z0-9_-]{43}$/.test(secret)) {
    throw new AppError("conflict", `the host secret in ${path} is not one this program wrote (expected 43 base64url characters); restore it from a backup, or, if the host's row should be claimed anew, delete the file and the row (delete from hosts where id='${hostId}')`);
  }
  return secret;
}

/** Lock files this process holds: a lock naming our pid that is not among them was left by an earlier process that had our pid (a container's pid 1). */
const heldHere = new Set<string>();

/**
 * Takes `<dataDir>/hosts/<hostId>/host.lock` (created whole: the pid is written to a temporary file, then linked into
 * place, so no reader sees an empty lock). A lock of a dead process is taken over; one of a live process is refused.
 */
export function lockHostDir(dataDir: string, hostId: string): () => void {
  const path = hostLockPath(dataDir, hostId);
  for (let attempt = 0; attempt < 5; attempt++) {
    const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
    writeDurably(tmp, String(process.pid));
    try {
      linkSync(tmp, path);
      heldHere.add(path);
      let released = false;
      return () => {
        if (released) return;
        released = true;
        heldHere.delete(path);
        rmSync(path, { force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    } finally {
      rmSync(tmp, { force: true });
    }
    const holder = readPid(path);
    if (holder === undefined) continue; // released between our link and our read
    // Locks are written whole: one without a pid is no lock (pid 0 would ask our own process group).
    const live = Number.isInteger(holder) && holder > 0 && (holder === process.pid ? heldHere.has(path) : pidAlive(holder));
    if (live) {
      throw new AppError(
        "conflict",
        `host ${hostId}: another process (pid ${holder}) runs on the data directory ${dataDir} (it holds ${path}); stop it first, or give this one another DATA_DIR and HOST_ID`,
      );
    }
    takeOverStale(path, holder);
  }
  throw new AppError("conflict", `host ${hostId}: could not take ${path} (other processes keep taking it); is another fleet-agent starting on ${dataDir}?`);
}

function readPid(path: string): number | undefined {
  try {
    return Number(readFileSync(path, "utf8").trim() || "0");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

/**
 * Moves a dead holder's lock aside by rename (atomic: of two processes taking it over, one moves it). When what was
 * moved is no longer the dead holder's (another process took it over meanwhile), it is linked back for its owner.
 */
function takeOverStale(path: string, deadPid: number): void {
  const aside = `${path}.stale-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    renameSync(path, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
    throw err;
  }
  if (readPid(aside) !== deadPid) {
    try {
      linkSync(aside, path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
  }
  rmSync(aside, { force: true });
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
