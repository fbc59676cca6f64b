// What a driver hands the launcher of an image's entrypoint: the host's environment for the agent, the spec file
// (guest/launch-spec.ts), and for VMs the tiny read-only drive that carries it into the guest (`agentvm-launch`).
//
// A drive rather than fw_cfg or the kernel command line: Firecracker has no fw_cfg, the command line is short and
// ends up in /proc/cmdline for every process to read, and a block device is what both hypervisors already give
// the guest. It is made afresh before every QEMU/Firecracker start (boot and restore: the hypervisor needs the
// same devices for a restore, the guest only reads it at boot), under a temporary name and renamed into place so
// a hypervisor that has the old one open keeps reading the old file.
import { mkdtemp, rename, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { DesktopSize } from "../../../contracts/agent.ts";
import { guestLeaseDir, type ImageConfig } from "../../../contracts/image.ts";
import { encodeLaunchSpec } from "../../guest/launch-spec.ts";
import { egressProxyEnv, upstreamsEnv } from "../../egress/guest-address.ts";
import { mke2fsBinary, runTool } from "./agent-disk.ts";

export const LAUNCH_DRIVE_FILE = "launch.ext4";
export const LAUNCH_DRIVE_LABEL = "agentvm-launch";
/** The file on the launch drive that the guest's init hands to the launcher. */
export const LAUNCH_SPEC_FILE = "launch.spec";
/** The file on the launch drive with the guest's hostname. */
export const LAUNCH_HOSTNAME_FILE = "hostname";

/** The PATH an image without one runs with (what OCI runtimes default to). */
export const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export interface LaunchIdentity {
  agentId: string;
  /** The port the agent must serve HTTP on: `config.port` in a VM, a free loopback port for the process driver. */
  port: number;
  /** The lease directory as the agent sees it: `guestLeaseDir` unless the driver puts it elsewhere. */
  leaseDir?: string;
  /** An agent with egress: the URL of the host's egress proxy as the guest reaches it (egress/guest-address.ts). */
  egressProxy?: string;
  /** A VM that reaches the proxy: its tenant's upstreams' names at boot (`AGENTVM_UPSTREAMS_URL`, `AGENTVM_UPSTREAM_<NAME>_URL`). */
  upstreams?: readonly string[];
  /** A desktop agent's display size (`AGENTVM_DESKTOP_SIZE`, read by the desktop base's session). */
  desktop?: DesktopSize;
}

/**
 * `PORT`, `AGENT_ID`, `LEASE_DIR`, with egress `HTTP_PROXY`, `HTTPS_PROXY`, `http_proxy`, `https_proxy`, `NO_PROXY`,
 * `no_proxy`, `NODE_USE_ENV_PROXY`, with the proxy `AGENTVM_UPSTREAMS_URL` and `AGENTVM_UPSTREAM_<NAME>_URL`, for a desktop
 * `AGENTVM_DESKTOP_SIZE`: what the host adds after
 * the image's own environment (these win over it).
 */
export function launchEnv(id: LaunchIdentity): string[] {
  return [
    `PORT=${id.port}`,
    `AGENT_ID=${id.agentId}`,
    `LEASE_DIR=${id.leaseDir ?? guestLeaseDir}`,
    ...(id.egressProxy ? egressProxyEnv(id.egressProxy) : []),
    ...(id.upstreams ? upstreamsEnv(id.upstreams) : []),
    ...(id.desktop ? [`AGENTVM_DESKTOP_SIZE=${id.desktop.width}x${id.desktop.height}`] : []),
  ];
}

/**
 * The launcher's spec file for an image and an agent: the image's command, its environment with `PATH` and `HOME`
 * defaulted as container runtimes do when the image sets none (`HOME` is `/root` for uid 0, else `/`), then
 * `launchEnv`.
 */
export function launchSpecFor(config: ImageConfig, id: LaunchIdentity): Buffer {
  const has = (key: string) => config.env.some((e) => e.startsWith(`${key}=`));
  const defaults = [...(has("PATH") ? [] : [`PATH=${DEFAULT_PATH}`]), ...(has("HOME") ? [] : [`HOME=${config.uid === 0 ? "/root" : "/"}`])];
  return encodeLaunchSpec({ ...config, env: [...defaults, ...config.env] }, launchEnv(id));
}

/** A hostname made of the agent id: lowercase letters, digits and `-`, at most 63 characters. */
export function guestHostname(agentId: string): string {
  const name = agentId
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 63);
  return name || "agent";
}

/**
 * Writes `<stateDir>/launch.ext4`: an ext4 (no journal: it is read-only in the guest) labelled `agentvm-launch`
 * holding `launch.spec` and `hostname`. Returns its path.
 */
export async function makeLaunchDrive(stateDir: string, config: ImageConfig, id: LaunchIdentity): Promise<string> {
  const spec = launchSpecFor(config, id);
  const path = join(stateDir, LAUNCH_DRIVE_FILE);
  const content = await mkdtemp(join(stateDir, ".launch-"));
  const tmp = `${path}.tmp`;
  try {
    await writeFile(join(content, LAUNCH_SPEC_FILE), spec);
    await writeFile(join(content, LAUNCH_HOSTNAME_FILE), `${guestHostname(id.agentId)}\n`);
    // 1 KiB blocks; room for the files twice over plus the filesystem's own few blocks.
    const kib = Math.max(256, Math.ceil((spec.length * 2) / 1024) + 128);
    await rm(tmp, { force: true });
    await runTool(mke2fsBinary(), [
      "-t",
      "ext4",
      "-q",
      "-F",
      "-O",
      "^has_journal",
      "-b",
      "1024",
      "-N",
      "16",
      "-L",
      LAUNCH_DRIVE_LABEL,
      "-d",
      content,
      tmp,
      `${kib}k`,
    ]);
    await rename(tmp, path);
  } finally {
    await rm(content, { recursive: true, force: true });
    await rm(tmp, { force: true });
  }
  return path;
}
