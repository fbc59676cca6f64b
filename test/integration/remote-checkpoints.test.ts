// Checkpoints through the remote fleet and a real host ingress (signed host calls): take, fork on the checkpoint's host, restore, delete.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq } from "drizzle-orm";
import { systemClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { componentKey } from "../../lib/host-token.ts";
import { newId } from "../../lib/ids.ts";
import { silentLogger } from "../../lib/log.ts";
import { agents, checkpoints, tenants } from "../../schema/core.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import { createDbPlacement } from "../../gateway/placement.ts";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import { freshDatabase } from "../helpers/db.ts";
import { startHostInProcess, testComponentSecret, type InProcessHost } from "../helpers/worker-stack.ts";
import { FakeCheckpointDriver, restoredFromFile } from "../helpers/fake-checkpoint-driver.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let daemon: InProcessHost;
let dataDir: string;

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_r", name: "r" });
  daemon = await startHostInProcess(database, { driver: new FakeCheckpointDriver() });
  dataDir = daemon.dataDir;
});
afterAll(async () => {
  await daemon?.stop();
  await database?.close();
});

const fleet = ({ liveWindowMs = 30_000 } = {}) =>
  createRemoteFleet({
    placement: createDbPlacement(database.db, { liveWindowMs, cacheTtlMs: 0, clock: systemClock }),
    key: componentKey(testComponentSecret),
    log: silentLogger,
  });

async function agent(hostId?: string): Promise<AgentSpec> {
  const id = newId("agent");
  await database.db.insert(agents).values({ id, tenantId: "ten_r", name: "a", image: "demo", ...(hostId ? { hostId } : {}) });
  return { id, tenantId: "ten_r", image: "demo", vcpus: 1, memMiB: 256, idleTimeoutMs: 60_000, streamIdleMs: 60_000, allowEgress: false };
}

describe("checkpoints over the host protocol", () => {
  it("takes one on the agent's host, forks a new agent there, restores, deletes; errors keep their codes across the hop", async () => {
    const f = fleet();
    const a = await agent();
    await f.wake(a, "api");
    const ckp = await f.checkpoint!(a, { name: "base", requestId: "req_remote0001" });
    expect(ckp).toMatchObject({ agentId: a.id, name: "base", origin: "api", hostId: daemon.hostId });
    const [row] = await database.db.select().from(checkpoints).where(eq(checkpoints.id, ckp.id));
    expect(row).toMatchObject({ requestId: "req_remote0001", hostId: daemon.hostId });
    const dup = await f.checkpoint!(a, { name: "base" }).catch((e: unknown) => e);
    expect(dup).toBeInstanceOf(AppError);
    expect((dup as AppError).code).toBe("conflict");

    // A fork's row names the checkpoint's host before its first call: the fork is made there, hibernated.
    const fork = await agent(ckp.hostId);
    expect(await f.fork!(fork, ckp.id)).toBe("hibernated");
    const vms = join(dataDir, "hosts", daemon.hostId, "vms");
    expect(readFileSync(join(vms, fork.id, restoredFromFile), "utf8")).toBe(ckp.id);
    expect((await f.status(fork.id))?.state).toBe("hibernated");

    expect(await f.restoreCheckpoint!(a, ckp.id)).toBe("hibernated");
    expect((await f.status(a.id))?.state).toBe("hibernated");
    // Another agent's checkpoint is refused by the host too, but for the one the agent was forked from (a reset).
    const stranger = await f.restoreCheckpoint!(fork, ckp.id).catch((e: unknown) => e);
    expect((stranger as AppError).code).toBe("not_found");
    await database.db.update(agents).set({ forkedFrom: ckp.id }).where(eq(agents.id, fork.id));
    expect(await f.restoreCheckpoint!(fork, ckp.id)).toBe("hibernated");
    const sibling = await agent(ckp.hostId);
    await database.db.update(agents).set({ forkedFrom: "ckp_someother0000" }).where(eq(agents.id, sibling.id));
    expect(await f.fork!(sibling, ckp.id)).toBe("hibernated");
    const notItsOwn = await f.restoreCheckpoint!(sibling, ckp.id).catch((e: unknown) => e);
    expect((notItsOwn as AppError).code).toBe("not_found");

    await f.deleteCheckpoint!(a.id, ckp.id);
    expect(existsSync(join(dataDir, "hosts", daemon.hostId, "checkpoints", ckp.id))).toBe(false);
    const [gone] = await database.db.select().from(checkpoints).where(eq(checkpoints.id, ckp.id));
    expect(gone?.deletedAt).toBeInstanceOf(Date);
  });

  it("an agent deleted while its host is not live takes its checkpoints' rows with it (the host sweeps their files at its next start)", async () => {
    const a = await agent();
    await fleet().wake(a, "api");
    const ckp = await fleet().checkpoint!(a, { name: "before-outage" });
    // Seen from a gateway whose live window is empty the host is not live, whatever its heartbeat (every 500 ms here) says.
    const outage = fleet({ liveWindowMs: 0 });
    await outage.remove(a.id); // the host is not live: nothing is asked of it
    await createAgentRepo(database.db).markDeleted(a.id);
    const [row] = await database.db.select().from(checkpoints).where(eq(checkpoints.id, ckp.id));
    expect(row!.deletedAt).not.toBeNull();
    expect(existsSync(join(dataDir, "hosts", daemon.hostId, "checkpoints", ckp.id))).toBe(true);
  });
});
