// Where a tenant's Containerfile runs: in the tenant's builder microVM wherever the fleet runs microVMs, on this host only when told to or when no host can run one.
import { and, gt, inArray, isNull, sql } from "drizzle-orm";
import type { ContainerfileRunner } from "../build/index.ts";
import { hosts } from "../../schema/core.ts";
import type { Db } from "../../schema/db.ts";
import { createVmBuilder, type BuilderPorts } from "./runner.ts";

import type { BuilderSize, ImageArtifact } from "../../contracts/image.ts";

export type { BuilderPorts } from "./runner.ts";

/** IMAGE_BUILDS: `vm` always in a builder VM, `host` always buildah on the building machine, `auto` a VM where a live host runs microVMs. */
export type ImageBuildsMode = "auto" | "vm" | "host";

/** A host heartbeating within this window counts as live for `auto`, ms. */
const liveWindowMs = 30_000;

/** The drivers whose agents are microVMs (a `process` host runs workloads as host processes: a build there isolates nothing). */
export const vmDrivers: readonly string[] = ["qemu", "firecracker"];

/** Whether a host that is live and not draining runs microVMs (for a gateway over remote hosts, which heartbeat). */
export async function microVmHostLive(db: Db): Promise<boolean> {
  const rows = await db
    .select({ id: hosts.id })
    .from(hosts)
    .where(
      and(inArray(hosts.driver, [...vmDrivers]), isNull(hosts.drainingAt), gt(hosts.lastHeartbeatAt, sql`now() - ${liveWindowMs} * interval '1 millisecond'`)),
    )
    .limit(1);
  return rows.length > 0;
}

/**
 * The image builder's `runnerFor` from a Node gateway's settings (spread into `createNodeImageBuilder`'s options):
 * the tenant's builder VM with `vm`, and with `auto` whenever `microVms()` says agents run in microVMs (the
 * all-in-one: its own driver; a gateway over remote hosts: a live one runs them, `microVmHostLive`); else none, so
 * buildah on this machine (always with `host`).
 */
export function imageRunners(
  cfg: { imageBuilds: { mode: ImageBuildsMode; timeoutMs: number; builder: BuilderSize }; imageCacheDir: string },
  parts: { ports: BuilderPorts; dataDir: string; publish?: (artifact: ImageArtifact) => Promise<void>; microVms: () => Promise<boolean> },
): { runnerFor?: (tenantId: string, buildId: string) => Promise<ContainerfileRunner | undefined> } {
  const mode = cfg.imageBuilds.mode;
  if (mode === "host") return {};
  const builder = createVmBuilder({
    ports: parts.ports,
    dataDir: parts.dataDir,
    cacheDir: cfg.imageCacheDir,
    size: cfg.imageBuilds.builder,
    timeoutMs: cfg.imageBuilds.timeoutMs,
    ...(parts.publish ? { publish: parts.publish } : {}),
  });
  return { runnerFor: async (tenantId, buildId) => (mode === "vm" || (await parts.microVms()) ? builder.runnerFor(tenantId, buildId) : undefined) };
}
