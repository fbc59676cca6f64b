// Where a Firecracker VM's files are (its stateDir, or the jailer's chroot inside it) and the `--id` it runs under.
import { join, relative } from "node:path";
import { processFiles } from "../common/state-dir.ts";

/**
 * Where a VM's files are. `root` holds everything the Firecracker process touches: the stateDir itself, or
 * under the jailer the chroot `<stateDir>/jail/<exec-file>/<id>/root`. `vm()` gives a host path as the
 * Firecracker process sees it (inside the chroot: relative to `root`, from "/").
 */
export interface VmPaths {
  root: string;
  apiSock: string;
  vsock: string;
  snapDir: string;
  /** Outside the chroot: console log and the pid file (pid + a command-line marker unique to this VM). */
  log: string;
  pidFile: string;
  marker: string;
  vm(hostPath: string): string;
}

export function vmPaths(stateDir: string, jail?: { execFile: string; id: string }): VmPaths {
  const root = jail ? join(stateDir, "jail", jail.execFile, jail.id, "root") : stateDir;
  const apiSock = join(root, "fc.sock");
  const { pidFile, log } = processFiles(stateDir, "firecracker");
  return {
    root,
    apiSock,
    vsock: join(root, "vsock.sock"),
    snapDir: join(root, "snapshots"),
    log,
    pidFile,
    // Under the jailer every VM's socket is "/fc.sock": its --id is what is unique on the command line.
    marker: jail ? jail.id : apiSock,
    vm: jail ? (p) => `/${relative(root, p)}` : (p) => p,
  };
}

/** Firecracker's `--id` allows alphanumerics and hyphens, up to 64 characters. */
export function firecrackerId(vmId: string): string {
  return vmId.replace(/[^A-Za-z0-9-]/g, "-").slice(0, 64);
}
