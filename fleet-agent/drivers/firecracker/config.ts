// Builds the firecracker driver from configuration (environment names below), for the program's edge to call.
//   FIRECRACKER_BIN        firecracker binary (default: `firecracker` on PATH)
//   FIRECRACKER_NET_CIDR   range cut into one /30 per VM (default 172.30.0.0/16)
//   FIRECRACKER_UPLINK     host interface egress leaves through, for agents that allow egress
//   FIRECRACKER_DIFF       true: diff snapshots after the first restore
//   FIRECRACKER_VERIFY     false: skip the sha256 check of snapshot files before a restore
//   FIRECRACKER_JAILER     jailer binary: run every VM under it, as FIRECRACKER_JAILER_UID/_GID (required then)
// (FIRECRACKER_TEMPLATES is read in ../select.ts, beside QEMU_TEMPLATES, and arrives here as `templates`.)
import { join, resolve } from "node:path";
import { bool, int, optStr, str, type Env } from "../../../lib/env.ts";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { FirecrackerDriver, type FirecrackerImage } from "./driver.ts";

export const NET_SETUP_SCRIPT = resolve(import.meta.dirname, "../../../scripts/setup-firecracker-net.sh");

export function firecrackerBinary(env: Env): string {
  return str(env, "FIRECRACKER_BIN", "firecracker");
}

export function createFirecrackerDriver(opts: {
  env: Env;
  dataDir: string;
  /** Kernel (ELF vmlinux) and initramfs per image name, e.g. from ensureGuestImage. */
  images: (image: string) => Promise<FirecrackerImage>;
  logger?: Logger;
  /** Warm templates under `root` (FirecrackerDriverOptions.templates); none when absent. */
  templates?: { root: string };
}): FirecrackerDriver {
  const { env } = opts;
  const uplink = optStr(env, "FIRECRACKER_UPLINK");
  const jailer = optStr(env, "FIRECRACKER_JAILER");
  return new FirecrackerDriver({
    binary: firecrackerBinary(env),
    images: opts.images,
    network: {
      slotsDir: join(opts.dataDir, "firecracker", "net-slots"),
      cidr: str(env, "FIRECRACKER_NET_CIDR", "172.30.0.0/16"),
      setupScript: NET_SETUP_SCRIPT,
      ...(uplink ? { uplink } : {}),
    },
    diffSnapshots: bool(env, "FIRECRACKER_DIFF", false),
    verifyChecksums: bool(env, "FIRECRACKER_VERIFY", true),
    ...(jailer ? { jailer: { binary: jailer, uid: requiredId(env, "FIRECRACKER_JAILER_UID"), gid: requiredId(env, "FIRECRACKER_JAILER_GID") } } : {}),
    ...(opts.logger ? { logger: opts.logger } : {}),
    ...(opts.templates ? { templates: opts.templates } : {}),
  });
}

function requiredId(env: Env, name: string): number {
  const id = int(env, name, -1, { min: 0 });
  if (id < 0) throw new AppError("bad_request", `configuration: ${name} is required with FIRECRACKER_JAILER (the uid/gid firecracker runs as)`);
  return id;
}
