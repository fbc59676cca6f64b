// The layout every driver shares inside a VM's stateDir: `<program>.pid` and `<program>.log` for the process that
// runs the VM, `snapshot.json` as the snapshot manifest, and unix sockets at paths short enough to bind.
//
// Socket paths: qemu moved its sockets to a short per-VM directory when `<stateDir>/agent.sock` was over 100
// characters, firecracker refused paths over 107 bytes. Kept: the real limit (sun_path holds 108 bytes with the
// NUL) counted in bytes; qemu still moves its sockets, firecracker (whose jailer needs them inside its chroot) refuses.
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const MANIFEST_FILE = "snapshot.json";

/** The longest unix socket path that binds (sun_path is 108 bytes, NUL included). */
export const SOCKET_PATH_MAX = 107;

export function fitsUnixSocket(path: string): boolean {
  return Buffer.byteLength(path) <= SOCKET_PATH_MAX;
}

/** Throws when `path` is too long for a unix socket. */
export function checkSocketPath(path: string): void {
  if (!fitsUnixSocket(path)) throw new Error(`socket path too long for a unix socket (${Buffer.byteLength(path)} > ${SOCKET_PATH_MAX} bytes): ${path}`);
}

/** Where a VM's sockets go: its stateDir, or a short per-VM directory in the temp dir when `longestName` would not fit there. */
export function socketDir(stateDir: string, longestName: string): string {
  if (fitsUnixSocket(join(stateDir, longestName))) return stateDir;
  return join(tmpdir(), `agentvm-${createHash("sha256").update(stateDir).digest("hex").slice(0, 16)}`);
}

/** The pid file and the log of the host process (`qemu`, `firecracker`, `workload`) that runs the VM. */
export function processFiles(stateDir: string, program: string): { pidFile: string; log: string } {
  return { pidFile: join(stateDir, `${program}.pid`), log: join(stateDir, `${program}.log`) };
}
