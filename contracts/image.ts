// What every component knows of an agent image: its config, where a host finds its files, and the catalog port the gateway resolves names with.

import type { DesktopSize } from "./agent.ts";

/** How to start an image, from its OCI config, resolved at build time (the guest has no passwd lookup of its own). */
export interface ImageConfig {
  /** OCI `Entrypoint` and `Cmd`: the process is `[...entrypoint, ...cmd]`. */
  entrypoint: string[];
  cmd: string[];
  /** `KEY=value`, in order; the host adds `PORT`, `AGENT_ID` and `LEASE_DIR` after these. */
  env: string[];
  /** Absolute; `/` when the image sets none. */
  workdir: string;
  /** As the image says it (`node`, `1000:1000`, empty for root), and the numeric ids it resolved to in the image's /etc/passwd and /etc/group. */
  user: string;
  uid: number;
  gid: number;
  /** TCP port the agent serves HTTP on inside the VM (`PORT` in its environment): the image's one `EXPOSE`d port, else 8080. */
  port: number;
  /** When set (label `agentvm.ready-path`), readiness is a 2xx/3xx/4xx answer on this path rather than an open port. */
  readyPath?: string;
  /** A desktop image (label `agentvm.desktop`, set by the `agentvm/desktop` base): the display size its agents get by default. */
  desktop?: DesktopSize;
}

/** A built image on a host's disk: content-addressed by the digest of its root filesystem. */
export interface ImageArtifact {
  /** `sha256:<64 hex>` of the root filesystem image. */
  digest: string;
  /** The read-only ext4 root filesystem (absolute path). */
  rootfs: string;
  /** Bytes of the root filesystem image. */
  sizeBytes: number;
  config: ImageConfig;
}

/** The lease directory an image's agent sees inside its root (a file there holds the VM awake, as in the demo). */
export const guestLeaseDir = "/run/agentvm/leases";
/** The port an image's agent listens on when its image names none. */
export const defaultImagePort = 8080;

const digestPattern = /^sha256:[0-9a-f]{64}$/;

export function isImageDigest(s: string): boolean {
  return digestPattern.test(s);
}

/** `<dataDir>/images/sha256/<hex>`: where an image's files live under a data directory (rootfs.ext4, image.json, build.log). */
export function imageDir(dataDir: string, digest: string): string {
  if (!isImageDigest(digest)) throw new Error(`not an image digest: ${digest}`);
  return `${dataDir.replace(/\/+$/, "")}/images/sha256/${digest.slice("sha256:".length)}`;
}

/** Looks a built image up by digest on one host; undefined when the host does not have it (whole). */
export type ImageLocator = (digest: string) => ImageArtifact | undefined;

/** An image row as the API shows it. */
export interface ImageRecord {
  id: string;
  tenantId: string;
  name: string;
  tag: string;
  digest: string;
  sizeBytes: number;
  config: ImageConfig;
  createdAt: string;
}

/** How the gateway resolves the image an agent names (`name:tag`, `name` for `:latest`, or a digest) for one tenant. */
export interface ImageCatalog {
  resolve(tenantId: string, ref: string): Promise<ImageRecord | undefined>;
}

/** What a tenant's image builder VM may use (images/vm-build/): its limits are a build's (memory, CPU, disk), as an agent's are its own. */
export interface BuilderSize {
  vcpus: number;
  memMiB: number;
  diskMiB: number;
  /** Idle time before the builder hibernates after a build, ms. */
  idleTimeoutMs: number;
}
