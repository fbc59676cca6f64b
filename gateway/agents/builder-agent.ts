// The tenant's image builder (images/vm-build/): an agent of its own (named `image-builder`) that runs the tenant's builds in its microVM, sleeps between them, and is billed like any agent.
import { and, eq, isNull } from "drizzle-orm";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Fleet, GuestCall } from "../../contracts/fleet.ts";
import { callGuest } from "../exec/guest.ts";
import type { BuilderSize } from "../../contracts/image.ts";
import { agentSpec, createAgentRepo } from "./repo.ts";
import { newId } from "../../lib/ids.ts";
import type { Db } from "../../schema/db.ts";
import { agents } from "../../schema/core.ts";

/** The name a tenant's builder agent has in its list of agents. */
export const BUILDER_AGENT_NAME = "image-builder";

/**
 * The tenant's builder agent for the builder image `digest`: the existing one, or a new one (an older image's builder
 * is removed: its storage holds bases of an older builder). Its egress is on: a build's RUN steps reach out through
 * the host's egress proxy, under the same address policy as every agent's.
 */
export async function builderAgentFor(db: Db, fleet: Fleet, tenantId: string, digest: string, size: BuilderSize): Promise<AgentSpec> {
  const rows = await db
    .select()
    .from(agents)
    .where(and(eq(agents.tenantId, tenantId), eq(agents.name, BUILDER_AGENT_NAME), isNull(agents.deletedAt)));
  const current = rows.find((r) => r.imageDigest === digest && r.memMiB === size.memMiB && r.diskMiB === size.diskMiB && r.vcpus === size.vcpus);
  const repo = createAgentRepo(db);
  for (const old of rows) {
    if (old === current) continue;
    await fleet.remove(old.id);
    await repo.markDeleted(old.id);
  }
  if (current) return agentSpec(current);
  const row = await repo.create({
    id: newId("agent"),
    tenantId,
    name: BUILDER_AGENT_NAME,
    image: "agentvm/builder",
    imageDigest: digest,
    vcpus: size.vcpus,
    memMiB: size.memMiB,
    diskMiB: size.diskMiB,
    idleTimeoutMs: size.idleTimeoutMs,
    streamIdleMs: 60_000,
    public: false,
    allowEgress: true,
  });
  return agentSpec(row);
}

/** What image builds in a VM need of the gateway (images/vm-build/ `BuilderPorts`): the tenant's builder agent, calls to its exec server. */
export function builderPorts(
  db: Db,
  fleet: Fleet,
): { builderAgent(tenantId: string, digest: string, size: BuilderSize): Promise<AgentSpec>; callGuest(agent: AgentSpec, call: GuestCall): Promise<Response> } {
  return {
    builderAgent: (tenantId, digest, size) => builderAgentFor(db, fleet, tenantId, digest, size),
    callGuest: (agent, call) => callGuest(fleet, agent, call),
  };
}
