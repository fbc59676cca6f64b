// Failover with real VMs and the shared artifact store: two QEMU fleet-agent processes and a gateway over one Postgres.
// An agent's hibernation is committed to the store; `kill -9` of its host → once the lease ends its next call restores
// it on the other host from the commit, its memory intact (the demo's counter goes on); the dead host, back, runs none.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { eq, sql } from "drizzle-orm";
import { agentCommits, agents, tenants } from "../../schema/core.ts";
import { ensureDevKeys, mintToken } from "../../compose/dev-keys.ts";
import { freshDatabase } from "../helpers/db.ts";
import { guestImage } from "../helpers/qemu.ts";
import { spawnNode, testComponentSecret, waitFor, type Child } from "../helpers/worker-stack.ts";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

const liveWindowMs = 3000;
let database: Awaited<ReturnType<typeof freshDatabase>>;
let storeDir: string;
let images: string;
let gateway: Child & { match: RegExpMatchArray };
let token: string;
const dirs: string[] = [];
const hostDirs = new Map<string, string>();
const hostProcs = new Map<string, Child>();

async function startHost(id: string): Promise<void> {
  let dir = hostDirs.get(id);
  if (!dir) {
    dir = mkdtempSync(join(tmpdir(), `agentvm-${id}-`));
    dirs.push(dir);
    hostDirs.set(id, dir);
    symlinkSync(images, join(dir, "images")); // the suite's built guest image, not a second build
  }
  const env = {
    DATABASE_URL: database.url,
    COMPONENT_SECRET: testComponentSecret,
    DATA_DIR: dir,
    HOST_ID: id,
    INGRESS_PORT: "0",
    DRIVER: "qemu",
    HOST_CAPACITY_MIB: "2048",
    HEARTBEAT_INTERVAL_MS: "250",
    METER_HEARTBEAT_MS: "500",
    REAPER_INTERVAL_MS: "200",
    ARTIFACT_STORE_DIR: storeDir,
  };
  hostProcs.set(id, await spawnNode("scripts/fleet-agent.ts", env, /fleet-agent (host_[0-9a-z]+) serving gateways at (http:\/\/\S+)/, 120_000));
}

const title = qemuPresent
  ? "failover through the shared artifact store (qemu)"
  : "failover through the shared artifact store (qemu) — skipped: qemu-system-x86_64 is not installed (npm run setup:vm)";
describe.skipIf(!qemuPresent)(title, () => {
  beforeAll(async () => {
    images = dirname(dirname((await guestImage()).kernel));
    database = await freshDatabase();
    storeDir = mkdtempSync(join(tmpdir(), "agentvm-store-"));
    dirs.push(storeDir);
    await Promise.all(["host_q1", "host_q2"].map(startHost));
    const gatewayDir = mkdtempSync(join(tmpdir(), "agentvm-gw-"));
    dirs.push(gatewayDir);
    const keys = await ensureDevKeys(gatewayDir);
    gateway = await spawnNode(
      "scripts/gateway.ts",
      {
        DATABASE_URL: database.url,
        COMPONENT_SECRET: testComponentSecret,
        DATA_DIR: gatewayDir,
        PORT: "0",
        HOST_LIVE_WINDOW_MS: String(liveWindowMs),
        PLACEMENT_CACHE_MS: "500",
        LOG_LEVEL: "error",
      },
      /gateway listening at (http:\/\/\S+)/,
    );
    token = await mintToken(keys.privateJwk, { tenant: "ten_qfail", scopes: ["agents:invoke", "agents:admin"] });
    await database.db.insert(tenants).values({ id: "ten_qfail", name: "qemu failover" });
  }, 240_000);

  afterAll(async () => {
    await gateway?.stop();
    for (const h of hostProcs.values()) await h.stop();
    await database?.close();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  const call = (path: string, init: RequestInit = {}) => {
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${token}`);
    return fetch(gateway.match[1] + path, { ...init, headers });
  };

  it("kill -9 of the agent's host: the other host restores its last committed hibernation, memory intact", async () => {
    const created = await call("/v1/agents", {
      method: "POST",
      body: JSON.stringify({ idleTimeoutMs: 120_000 }),
      headers: { "content-type": "application/json" },
    });
    expect(created.status).toBe(201);
    const { id } = (await created.json()) as { id: string };
    for (let n = 1; n <= 3; n++) {
      const res = await call(`/a/${id}/counter`, { method: "POST" });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ count: n });
    }
    expect((await call(`/v1/agents/${id}/hibernate`, { method: "POST" })).status).toBe(200);
    const [placed] = await database.db.select().from(agents).where(eq(agents.id, id));
    const first = placed!.hostId!;
    const other = first === "host_q1" ? "host_q2" : "host_q1";
    // The commit lands after the hibernation, in the background; its time is the run's end.
    await waitFor(
      async () => {
        const rows = await database.db.execute(
          sql`select 1 from agent_commits c where c.agent_id = ${id} and c.snapshot_at >= (select max(slept_at) from runs where agent_id = ${id})`,
        );
        return (rows as unknown as unknown[]).length === 1;
      },
      60_000,
      "the hibernation committed to the store",
    );
    const [commit] = await database.db.select().from(agentCommits).where(eq(agentCommits.agentId, id));
    expect(commit).toMatchObject({ hostId: first, generation: placed!.generation });
    expect(Object.keys(commit!.files).length).toBeGreaterThan(0);

    const killedAt = performance.now();
    hostProcs.get(first)!.proc.kill("SIGKILL");
    let res: Response;
    const seen: number[] = [];
    for (;;) {
      res = await call(`/a/${id}/counter`, { method: "POST" });
      seen.push(res.status);
      if (res.status === 200) break;
      expect(res.status).toBe(503);
      expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(0);
      await res.body?.cancel();
      if (performance.now() - killedAt > 120_000) throw new Error("not served by the other host within 120 s");
      await new Promise((r) => setTimeout(r, 250));
    }
    const answeredMs = Math.round(performance.now() - killedAt);
    expect(res.headers.get("x-wake")).toBe("restore");
    expect(await res.json()).toEqual({ count: 4 }); // the committed memory, on another machine
    console.log(
      `qemu failover: answered from ${other} ${answeredMs} ms after the kill (lease ${liveWindowMs} ms), ${seen.length - 1} × 503 before; ${res.headers.get("server-timing")}`,
    );
    const [moved] = await database.db.select().from(agents).where(eq(agents.id, id));
    expect(moved).toMatchObject({ hostId: other, generation: placed!.generation + 1 });

    // The dead host comes back: its stale copy of the agent is removed, and the agent stays where it is.
    await startHost(first);
    const staleDir = join(hostDirs.get(first)!, "hosts", first, "vms", id);
    await waitFor(() => !existsSync(staleDir), 20_000, "the stale copy removed from the old host");
    const again = await call(`/a/${id}/counter`, { method: "POST" });
    expect(again.headers.get("x-wake")).toBe("warm");
    expect(await again.json()).toEqual({ count: 5 });
    const [after] = await database.db.select().from(agents).where(eq(agents.id, id));
    expect(after).toMatchObject({ hostId: other, generation: placed!.generation + 1 });
  }, 300_000);
});
