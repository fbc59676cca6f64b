// Checkpoints through the real system (Postgres, HTTP, the host) over a driver that copies directories: take, list, restore, fork, delete, guest requests, billing.
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { and, eq, isNull } from "drizzle-orm";
import { agents, auditLog, checkpoints, runs, vmEvents } from "../../schema/core.ts";
import { checkpointStorage, snapshotStorage } from "../../billing/storage.ts";
import { newId } from "../../lib/ids.ts";
import { FakeCheckpointDriver, checkpointRequestsFile, restoredFromFile } from "../helpers/fake-checkpoint-driver.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { runAgentvm } from "../helpers/cli.ts";

let sys: TestSystem;
let driver: FakeCheckpointDriver;
let other: string; // a token of another tenant

interface Checkpoint {
  id: string;
  agentId: string;
  name: string | null;
  origin: string;
  bytes: number;
  pausedMs: number;
  createdAt: string;
}

const json = { "content-type": "application/json" };
const post = (path: string, body: unknown, token?: string) =>
  sys.call(path, { method: "POST", headers: json, body: JSON.stringify(body), ...(token !== undefined ? { token } : {}) });
const stateDir = (agentId: string) => join(sys.dataDir, "hosts", sys.host.hostId, "vms", agentId);
const checkpointDirOf = (id: string) => join(sys.dataDir, "hosts", sys.host.hostId, "checkpoints", id);

async function until(what: string, check: () => Promise<boolean> | boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function awakeAgent(): Promise<string> {
  const { id } = await sys.createAgent({ idleTimeoutMs: 600_000 });
  expect((await sys.call(`/a/${id}/counter`)).status).toBe(200);
  return id;
}

async function take(agentId: string, body: Record<string, unknown> = {}): Promise<Checkpoint> {
  const res = await post(`/v1/agents/${agentId}/checkpoints`, body);
  expect(res.status, await res.clone().text()).toBe(201);
  return (await res.json()) as Checkpoint;
}

beforeAll(async () => {
  driver = new FakeCheckpointDriver();
  sys = await startSystem({ driver });
  await sys.ensureTenant("ten_other");
  other = await sys.token({ tenant: "ten_other" });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
});

describe("checkpoints", () => {
  it("takes one of an awake agent: 201, the row (origin api, its host, the call's request id), both audit rows, the files", async () => {
    const agentId = await awakeAgent();
    const res = await post(`/v1/agents/${agentId}/checkpoints`, { name: "clean" });
    expect(res.status, await res.clone().text()).toBe(201);
    const ckp = (await res.json()) as Checkpoint;
    expect(ckp).toMatchObject({ agentId, name: "clean", origin: "api" });
    expect(ckp.id).toMatch(/^ckp_/);
    expect(ckp.bytes).toBeGreaterThan(0);
    const [row] = await sys.database.db.select().from(checkpoints).where(eq(checkpoints.id, ckp.id));
    expect(row).toMatchObject({
      agentId,
      hostId: sys.host.hostId,
      tenantId: sys.demo.tenantId,
      origin: "api",
      bytes: ckp.bytes,
      requestId: res.headers.get("x-request-id"),
      deletedAt: null,
    });
    expect(JSON.parse(readFileSync(join(checkpointDirOf(ckp.id), "checkpoint.json"), "utf8"))).toEqual({ agentId, running: true });
    const audits = await sys.database.db.select().from(auditLog).where(eq(auditLog.target, agentId));
    expect(audits.map((a) => a.action)).toEqual(expect.arrayContaining(["checkpoint.create", "vm.checkpoint"]));
    expect(audits.find((a) => a.action === "checkpoint.create")?.requestId).toBe(res.headers.get("x-request-id"));
    // The agent is still awake: a checkpoint pauses it, never hibernates it.
    expect(await sys.state(agentId)).toBe("running");
  });

  it("answers 409 on a name the agent already uses, 400 naming the field on a bad name, 409 for an agent that never ran", async () => {
    const agentId = await awakeAgent();
    await take(agentId, { name: "n1" });
    const dup = await post(`/v1/agents/${agentId}/checkpoints`, { name: "n1" });
    expect(dup.status).toBe(409);
    expect(((await dup.json()) as { error: { code: string } }).error.code).toBe("conflict");
    const bad = await post(`/v1/agents/${agentId}/checkpoints`, { name: "ckp_looks_like_an_id" });
    expect(bad.status).toBe(400);
    expect(await bad.text()).toContain("name");
    const fresh = await sys.createAgent();
    expect((await post(`/v1/agents/${fresh.id}/checkpoints`, {})).status).toBe(409);
    const rows = await sys.database.db.select().from(checkpoints).where(eq(checkpoints.agentId, agentId));
    expect(rows).toHaveLength(1);
  });

  it("lists them a page at a time and shows one; another tenant's checkpoint does not exist for the caller (404)", async () => {
    const agentId = await awakeAgent();
    const a = await take(agentId, { name: "a" });
    const b = await take(agentId);
    const first = (await (await sys.call(`/v1/agents/${agentId}/checkpoints?limit=1`)).json()) as { checkpoints: Checkpoint[]; nextCursor: string | null };
    expect(first.checkpoints.map((c) => c.id)).toEqual([a.id]);
    expect(first.nextCursor).not.toBeNull();
    const second = (await (await sys.call(`/v1/agents/${agentId}/checkpoints?limit=1&cursor=${first.nextCursor}`)).json()) as {
      checkpoints: Checkpoint[];
      nextCursor: string | null;
    };
    expect(second.checkpoints.map((c) => c.id)).toEqual([b.id]);
    expect(second.nextCursor).toBeNull();
    expect(((await (await sys.call(`/v1/agents/${agentId}/checkpoints/${b.id}`)).json()) as Checkpoint).id).toBe(b.id);

    // Another tenant: neither the agent's routes nor a fork from its checkpoint id, nor a restore of its own agent to it.
    expect((await sys.call(`/v1/agents/${agentId}/checkpoints/${b.id}`, { token: other })).status).toBe(404);
    expect((await sys.call(`/v1/agents/${agentId}/checkpoints/${b.id}`, { method: "DELETE", token: other })).status).toBe(404);
    expect((await post("/v1/agents", { fromCheckpoint: b.id }, other)).status).toBe(404);
    const theirs = await sys.createAgent({}, other);
    expect((await post(`/v1/agents/${theirs.id}/restore`, { checkpoint: b.id }, other)).status).toBe(404);
    // A checkpoint of another agent of the same tenant is not this agent's.
    const sibling = await sys.createAgent();
    expect((await post(`/v1/agents/${sibling.id}/restore`, { checkpoint: a.id })).status).toBe(404);
    expect((await post(`/v1/agents/${sibling.id}/restore`, { checkpoint: "a" })).status).toBe(404);
    expect(existsSync(checkpointDirOf(b.id))).toBe(true);
  });

  it("restores an awake agent by name: stopped (run ended), hibernated on the checkpoint's files, then woken by the next call", async () => {
    const agentId = await awakeAgent();
    writeFileSync(join(stateDir(agentId), "before"), "1");
    const ckp = await take(agentId, { name: "episode-start" });
    writeFileSync(join(stateDir(agentId), "after"), "2");
    const res = await post(`/v1/agents/${agentId}/restore`, { checkpoint: "episode-start" });
    expect(res.status, await res.clone().text()).toBe(200);
    expect(((await res.json()) as { state: string }).state).toBe("hibernated");
    expect(existsSync(join(stateDir(agentId), "before"))).toBe(true);
    expect(existsSync(join(stateDir(agentId), "after"))).toBe(false); // its own later state is gone
    expect(readFileSync(join(stateDir(agentId), restoredFromFile), "utf8")).toBe(ckp.id);
    await sys.host.flush();
    const events = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, agentId)).orderBy(vmEvents.id);
    const last = events.slice(-2).map((e) => [e.fromState, e.toState, e.reason]);
    expect(last).toEqual([
      ["running", "stopped", "api"],
      ["stopped", "hibernated", "api"],
    ]);
    expect(events.at(-1)?.detail).toMatchObject({ restoredFrom: ckp.id });
    const open = await sys.database.db
      .select()
      .from(runs)
      .where(and(eq(runs.agentId, agentId), isNull(runs.sleptAt)));
    expect(open).toHaveLength(0);
    const audits = await sys.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.target, agentId), eq(auditLog.action, "agent.restore")));
    expect(audits).toHaveLength(1);
    // The next call wakes it (the process driver boots over the restored files).
    expect((await sys.call(`/a/${agentId}/counter`)).status).toBe(200);
    expect(await sys.state(agentId)).toBe("running");
  });

  it("never runs a checkpoint during a wake: a call to a hibernated agent waits for the copy", async () => {
    const agentId = await awakeAgent();
    expect((await sys.call(`/v1/agents/${agentId}/hibernate`, { method: "POST" })).status).toBe(200);
    driver.checkpointDelayMs = 400;
    try {
      const taking = post(`/v1/agents/${agentId}/checkpoints`, {});
      await until("the checkpoint to start", () => driver.happened.includes(`checkpoint:start ${agentId}`));
      const called = await sys.call(`/a/${agentId}/counter`);
      expect(called.status).toBe(200);
      expect((await taking).status).toBe(201);
    } finally {
      driver.checkpointDelayMs = 0;
    }
    const mine = driver.happened.filter((e) => e.endsWith(agentId));
    expect(mine.slice(-3)).toEqual([`checkpoint:start ${agentId}`, `checkpoint:end ${agentId}`, `wake ${agentId}`]);
    const [row] = await sys.database.db.select().from(checkpoints).where(eq(checkpoints.agentId, agentId));
    expect(row?.pausedMs).toBe(0); // taken from the hibernated agent's snapshot
  });

  it("forks new agents from a checkpoint: 201 with forkedFrom, hibernated on its host before the first call, each independent", async () => {
    const agentId = await awakeAgent();
    writeFileSync(join(stateDir(agentId), "workspace"), "clean");
    const ckp = await take(agentId, { name: "base" });
    const refused = await post("/v1/agents", { fromCheckpoint: ckp.id, memMiB: 512 });
    expect(refused.status).toBe(400);
    expect(await refused.text()).toContain("memMiB");
    expect((await post("/v1/agents", { fromCheckpoint: "nope" })).status).toBe(400);

    const forks: { id: string; state: string; forkedFrom: string | null }[] = [];
    expect((await post("/v1/agents", { fromCheckpoint: `${agentId}:no-such-name` })).status).toBe(404);
    // By id, and by the agent's checkpoint's name (`agt_…:name`, as `restore` takes a name).
    for (const [name, fromCheckpoint] of [
      ["fork-1", ckp.id],
      ["fork-2", `${agentId}:base`],
    ] as const) {
      const res = await post("/v1/agents", { fromCheckpoint, name });
      expect(res.status, await res.clone().text()).toBe(201);
      forks.push((await res.json()) as (typeof forks)[number]);
    }
    for (const f of forks) {
      expect(f).toMatchObject({ forkedFrom: ckp.id, state: "hibernated" });
      const [row] = await sys.database.db.select().from(agents).where(eq(agents.id, f.id));
      expect(row).toMatchObject({ hostId: sys.host.hostId, forkedFrom: ckp.id });
      expect(readFileSync(join(stateDir(f.id), "workspace"), "utf8")).toBe("clean");
      expect(readFileSync(join(stateDir(f.id), restoredFromFile), "utf8")).toBe(ckp.id);
    }
    await sys.host.flush();
    const forkEvents = await sys.database.db.select().from(vmEvents).where(eq(vmEvents.agentId, forks[0]!.id));
    expect(forkEvents.map((e) => [e.fromState, e.toState])).toEqual([["creating", "hibernated"]]); // never creating → booting
    // Independent: a change in one fork is in neither the other nor the checkpoint.
    writeFileSync(join(stateDir(forks[0]!.id), "workspace"), "dirty");
    expect(readFileSync(join(stateDir(forks[1]!.id), "workspace"), "utf8")).toBe("clean");
    expect(readFileSync(join(checkpointDirOf(ckp.id), "state", "workspace"), "utf8")).toBe("clean");
    expect((await sys.call(`/a/${forks[1]!.id}/counter`)).status).toBe(200);
  });

  it("takes a checkpoint the workload asks for from inside, once, recorded like an API one (origin guest)", async () => {
    const agentId = await awakeAgent();
    writeFileSync(join(stateDir(agentId), checkpointRequestsFile), "episode-1\n");
    const guestRows = () =>
      sys.database.db
        .select()
        .from(checkpoints)
        .where(and(eq(checkpoints.agentId, agentId), eq(checkpoints.origin, "guest")));
    await until("the guest's checkpoint", async () => (await guestRows()).length > 0);
    await new Promise((r) => setTimeout(r, 500)); // several more reaper passes (100 ms apart)
    const rows = await guestRows();
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ name: "episode-1", requestId: null, hostId: sys.host.hostId });
    expect(existsSync(checkpointDirOf(rows[0]!.id))).toBe(true);
    const listed = (await (await sys.call(`/v1/agents/${agentId}/checkpoints`)).json()) as { checkpoints: Checkpoint[] };
    expect(listed.checkpoints.map((c) => [c.name, c.origin])).toEqual([["episode-1", "guest"]]);
    const audits = await sys.database.db
      .select()
      .from(auditLog)
      .where(and(eq(auditLog.target, agentId), eq(auditLog.action, "vm.checkpoint")));
    expect(audits).toHaveLength(1);
    expect(audits[0]?.actor).toBe(sys.host.hostId);
  });

  it("deletes one on request (row marked, files gone), and all of an agent's with it, but never its forks", async () => {
    const agentId = await awakeAgent();
    const one = await take(agentId);
    const res = await sys.call(`/v1/agents/${agentId}/checkpoints/${one.id}`, { method: "DELETE" });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ id: one.id, deleted: true });
    expect(existsSync(checkpointDirOf(one.id))).toBe(false);
    const [gone] = await sys.database.db.select().from(checkpoints).where(eq(checkpoints.id, one.id));
    expect(gone?.deletedAt).toBeInstanceOf(Date);
    expect((await sys.call(`/v1/agents/${agentId}/checkpoints/${one.id}`)).status).toBe(404);

    const kept = await take(agentId, { name: "kept" });
    const fork = (await (await post("/v1/agents", { fromCheckpoint: kept.id })).json()) as { id: string };
    expect((await sys.call(`/v1/agents/${agentId}`, { method: "DELETE" })).status).toBe(200);
    const rows = await sys.database.db.select().from(checkpoints).where(eq(checkpoints.agentId, agentId));
    expect(rows.every((r) => r.deletedAt !== null)).toBe(true);
    expect(existsSync(checkpointDirOf(kept.id))).toBe(false);
    // The fork is an agent of its own: its files and its calls are untouched.
    expect((await sys.call(`/v1/agents/${fork.id}`)).status).toBe(200);
    expect(existsSync(join(stateDir(fork.id), restoredFromFile))).toBe(true);
    expect((await sys.call(`/a/${fork.id}/counter`)).status).toBe(200);
  });

  it("bills a checkpoint's bytes as snapshot storage from its creation to its deletion, in the agent's snapshot_storage figure", async () => {
    const db = sys.database.db;
    await sys.ensureTenant("ten_bill");
    const agentId = newId("agent");
    await db.insert(agents).values({ id: agentId, tenantId: "ten_bill", name: "b", image: "demo" });
    const h = 3_600_000;
    const t0 = Date.UTC(2026, 0, 1);
    // 1000 bytes from 01:00 to 03:00 (deleted), 10 bytes from 02:00 on (live): over [00:00, 04:00).
    await db.insert(checkpoints).values([
      {
        id: newId("checkpoint"),
        tenantId: "ten_bill",
        agentId,
        hostId: "host_x",
        name: null,
        origin: "api",
        bytes: 1000,
        pausedMs: 1,
        createdAt: new Date(t0 + h),
        deletedAt: new Date(t0 + 3 * h),
      },
      {
        id: newId("checkpoint"),
        tenantId: "ten_bill",
        agentId,
        hostId: "host_x",
        name: "live",
        origin: "guest",
        bytes: 10,
        pausedMs: 1,
        createdAt: new Date(t0 + 2 * h),
      },
    ]);
    const expected = 1000n * BigInt(2 * h) + 10n * BigInt(2 * h);
    expect((await checkpointStorage(db, "ten_bill", t0, t0 + 4 * h)).get(agentId)).toBe(expected);
    // The same figure invoices price: hibernated snapshots (none here) plus checkpoints.
    expect((await snapshotStorage(db, "ten_bill", t0, t0 + 4 * h)).get(agentId)).toBe(expected);
    // A period that starts after the deleted one went counts only the live one.
    expect((await snapshotStorage(db, "ten_bill", t0 + 3 * h, t0 + 4 * h)).get(agentId)).toBe(10n * BigInt(h));
  });
});

describe("agentvm checkpoints, restore, agents create --from-checkpoint", () => {
  let home: string;
  beforeAll(() => {
    home = mkdtempSync(join(tmpdir(), "agentvm-cli-ckp-home-"));
  });
  afterAll(() => rmSync(home, { recursive: true, force: true }));

  const agentvm = (args: string[]) => runAgentvm(args, { url: sys.url, token: sys.demo.token, home });

  it("create → ls → restore by name → fork → rm, and a duplicate name exits 1 with the envelope's message", async () => {
    const agentId = await awakeAgent();
    const created = await agentvm(["checkpoints", "create", agentId, "--name", "cli"]);
    expect(created.code, created.err).toBe(0);
    const id = created.out.match(/^(ckp_[0-9a-z]+) \(cli\)/)?.[1];
    expect(id, created.out).toBeDefined();
    const dup = await agentvm(["checkpoints", "create", agentId, "--name", "cli"]);
    expect(dup.code).toBe(1);
    expect(dup.err).toContain("already has a checkpoint");
    const ls = await agentvm(["--json", "checkpoints", "ls", agentId]);
    expect(ls.code, ls.err).toBe(0);
    expect((JSON.parse(ls.out) as { checkpoints: Checkpoint[] }).checkpoints.map((c) => c.id)).toEqual([id]);
    const table = await agentvm(["checkpoints", "ls", agentId]);
    expect(table.out).toMatch(new RegExp(`${id}\\s+cli\\s+api`));
    const restored = await agentvm(["restore", agentId, "cli"]);
    expect(restored.code, restored.err).toBe(0);
    expect(restored.out).toContain(`${agentId} hibernated`);
    const fork = await agentvm(["--json", "agents", "create", "--from-checkpoint", id!]);
    expect(fork.code, fork.err).toBe(0);
    expect(JSON.parse(fork.out)).toMatchObject({ forkedFrom: id, state: "hibernated" });
    const rm = await agentvm(["checkpoints", "rm", agentId, id!]);
    expect(rm.code, rm.err).toBe(0);
    expect(rm.out).toBe(`deleted ${id}\n`);
    expect((await sys.call(`/v1/agents/${agentId}/checkpoints/${id}`)).status).toBe(404);
  });
});

describe("checkpoints on a driver that keeps none", () => {
  let plain: TestSystem;
  beforeAll(async () => {
    plain = await startSystem();
  }, 60_000);
  afterAll(async () => {
    await plain?.stop();
  });

  it("answers 501 checkpoints_unsupported naming the driver", async () => {
    const { id } = await plain.createAgent();
    expect((await plain.call(`/a/${id}/counter`)).status).toBe(200);
    const res = await plain.call(`/v1/agents/${id}/checkpoints`, { method: "POST", headers: json, body: "{}" });
    expect(res.status).toBe(501);
    const body = (await res.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("checkpoints_unsupported");
    expect(body.error.message).toContain("process");
  });
});
