// Where a tenant's Containerfile runs: in the tenant's builder microVM wherever the fleet runs microVMs, on this host only when told to or when no host can run one.
import { and, gt, inArray, isNull, sql } from "drizzle-orm";
import type { ContainerfileRunner } from "../build/index.ts";
import { hosts } from "../../schema/core.ts";
import type { Db } from "../../schema/db.ts";
import { createVmBuilder, type BuilderPorts, type VmBuilderOptions } from "./runner.ts";

import type { BuilderSize, ImageArtifact } from "../../contracts/image.ts";

export type { BuilderPorts } from "./runner.ts";

/** IMAGE_BUILDS: `vm` always in a builder VM, `host` always buildah on the building machine, `auto` a VM where a live host runs microVMs. */
export type ImageBuildsMode = "auto" | "vm" | "host";

/** A host heartbeating within this window counts as live for `auto`, ms. */
const liveWindowMs = 30_000;

/** The drivers whose agents are microVMs (a `process` host runs workloads as host processes: a build there isolates nothing). */
const vmDrivers = ["qemu", "firecracker"];

/** Whether a host that is live and not draining runs microVMs. */
export async function microVmHostLive(db: Db): Promise<boolean> {
  const rows = await db
    .select({ id: hosts.id })
    .from(hosts)
    .where(and(inArray(hosts.driver, vmDrivers), isNull(hosts.drainingAt), gt(hosts.lastHeartbeatAt, sql`now() - ${liveWindowMs} * interval '1 millisecond'`)))
    .limit(1);
  return rows.length > 0;
}

/**
 * The runner of each Containerfile build (node-builder's `runnerFor`): the tenant's builder VM (`vm`; `auto` when a
 * host runs microVMs now, else undefined: buildah on this machine, as with `host`).
 */
export function containerfileRunners(
  opts: VmBuilderOptions & { mode: ImageBuildsMode; db: Db },
): ((tenantId: string, buildId: string) => Promise<ContainerfileRunner | undefined>) | undefined {
  if (opts.mode === "host") return undefined;
  const builder = createVmBuilder(opts);
  return async (tenantId, buildId) => (opts.mode === "vm" || (await microVmHostLive(opts.db)) ? builder.runnerFor(tenantId, buildId) : undefined);
}

/** The image builder's `runnerFor` from a Node gateway's settings (spread into `createNodeImageBuilder`'s options): none with `host`. */
export function imageRunners(
  cfg: { imageBuilds: { mode: ImageBuildsMode; timeoutMs: number; builder: BuilderSize }; imageCacheDir: string },
  db: Db,
  ports: BuilderPorts,
  dataDir: string,
  publish: ((artifact: ImageArtifact) => Promise<void>) | undefined,
): { runnerFor?: (tenantId: string, buildId: string) => Promise<ContainerfileRunner | undefined> } {
  const runnerFor = containerfileRunners({
    mode: cfg.imageBuilds.mode,
    db,
    ports,
    dataDir,
    cacheDir: cfg.imageCacheDir,
    size: cfg.imageBuilds.builder,
    timeoutMs: cfg.imageBuilds.timeoutMs,
    ...(publish ? { publish } : {}),
  });
  return runnerFor ? { runnerFor } : {};
}
