// The audit trail of the whole system over real sockets (all-in-one, process driver, real Postgres with the pool as agentvm_app): a call's wake carries its request id, hibernations and admin actions are rows, the chain verifies.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { and, eq, sql } from "drizzle-orm";
import { auditLog } from "../../schema/core.ts";
import { verifyAuditChain } from "../../schema/audit-verify.ts";
import { queryRows } from "../../schema/db.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { waitFor } from "../helpers/wait.ts";

let sys: TestSystem;

beforeAll(async () => {
  sys = await startSystem();
});
afterAll(async () => {
  await sys?.stop();
});

interface Entry {
  seq: number;
  actor: string;
  action: string;
  target: string;
  requestId: string | null;
}

describe("audit trail end to end", () => {
  it("runs as agentvm_app; a call's wake, an API hibernate and the admin calls are audited with who and the request id; GET /v1/audit shows them; the chain verifies", async () => {
    const [who] = await queryRows<{ current_user: string }>(sys.database.db, sql`select current_user`);
    expect(who!.current_user).toBe("agentvm_app");

    const created = await sys.call("/v1/agents", {
      method: "POST",
      body: JSON.stringify({ idleTimeoutMs: 60_000 }),
      headers: { "content-type": "application/json" },
    });
    expect(created.status).toBe(201);
    const agentId = ((await created.json()) as { id: string }).id;
    const createRequest = created.headers.get("x-request-id");

    const first = await sys.call(`/a/${agentId}/`);
    expect(first.status).toBe(200);
    expect(first.headers.get("x-wake")).toBe("boot");
    const callRequest = first.headers.get("x-request-id");
    expect(callRequest).toMatch(/^req_/);
    await first.arrayBuffer();

    const hib = await sys.call(`/v1/agents/${agentId}/hibernate`, { method: "POST" });
    expect(hib.status).toBe(200);
    const hibRequest = hib.headers.get("x-request-id");

    await sys.host.flush();
    const rowsOf = async (action: string) =>
      sys.database.db
        .select()
        .from(auditLog)
        .where(and(eq(auditLog.target, agentId), eq(auditLog.action, action)));
    await waitFor(async () => (await rowsOf("vm.hibernate")).length === 1, 10_000);
    const [wake] = await rowsOf("vm.wake");
    expect(wake).toMatchObject({ tenantId: sys.demo.tenantId, requestId: callRequest, actor: sys.host.hostId });
    expect(wake!.detail).toMatchObject({ reason: "request", requestId: callRequest });
    const [hibernated] = await rowsOf("vm.hibernate");
    expect(hibernated!.actor).toBe(sys.host.hostId);
    expect(hibernated!.detail).toMatchObject({ reason: "api" });

    const res = await sys.call(`/v1/audit?target=${agentId}`);
    expect(res.status).toBe(200);
    const { entries } = (await res.json()) as { entries: Entry[] };
    // The host writes its transitions through its event log, after the answer: vm.hibernate and agent.hibernate may come in either order.
    expect(entries.map((e) => e.action).sort()).toEqual(["agent.create", "agent.hibernate", "vm.hibernate", "vm.wake"]);
    expect(entries.at(-1)!.action).toBe("agent.create");
    expect(entries.find((e) => e.action === "agent.create")).toMatchObject({ requestId: createRequest, actor: "demo" });
    expect(entries.find((e) => e.action === "agent.hibernate")).toMatchObject({ requestId: hibRequest });
    expect(entries.map((e) => e.seq)).toEqual([...entries.map((e) => e.seq)].sort((a, b) => b - a));

    expect(await verifyAuditChain(sys.database.db, sys.demo.tenantId)).toMatchObject({ ok: true });
  });
});
