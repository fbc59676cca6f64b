// A host id belongs to the data directory that registered it (its secret), one process per data directory (its lock); heartbeats report the host's clock skew and load, and stop when the row is taken.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { count, eq, sql } from "drizzle-orm";
import { claimHost, registerHost, startHeartbeat } from "../../fleet-agent/assemble.ts";
import { hostLockPath, hostSecretPath, openHostIdentity, secretHashOf } from "../../fleet-agent/host-identity.ts";
import { meterDir } from "../../fleet-agent/meter/spool.ts";
import { systemClock, type Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { createLogger } from "../../lib/log.ts";
import { hosts } from "../../schema/core.ts";
import { meterConflicts, meterSegments } from "../../schema/billing.ts";
import { freshDatabase } from "../helpers/db.ts";
import { spawnNode, testComponentSecret, waitFor, type Child } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
const dirs: string[] = [];
const children: Child[] = [];
const tempDir = (name: string) => {
  const d = mkdtempSync(join(tmpdir(), `agentvm-identity-${name}-`));
  dirs.push(d);
  return d;
};
const row = async (id: string) => (await database.db.select().from(hosts).where(eq(hosts.id, id)))[0];
const refusal = async (p: Promise<unknown> | (() => unknown)): Promise<AppError> => {
  const err = await (typeof p === "function" ? Promise.resolve().then(p) : p).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  expect((err as AppError).code).toBe("conflict");
  return err as AppError;
};
function captured() {
  const lines: { level: string; msg: string; [k: string]: unknown }[] = [];
  return { lines, log: createLogger({ level: "debug", write: (l) => lines.push(JSON.parse(l) as (typeof lines)[number]) }) };
}
const aheadBy = (ms: number): Clock => ({ ...systemClock, now: () => Date.now() + ms });

beforeAll(async () => {
  database = await freshDatabase();
});

afterAll(async () => {
  for (const c of children) await c.stop();
  await database?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe("host identity", () => {
  it("the first start makes the secret (0600, 32 bytes base64url) and registers its hash; another data directory is refused; the first again works", async () => {
    const a = tempDir("a");
    const b = tempDir("b");
    const idA = openHostIdentity(a, "h1");
    const secret = readFileSync(hostSecretPath(a, "h1"), "utf8").trim();
    expect(secret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(secret, "base64url")).toHaveLength(32);
    expect(statSync(hostSecretPath(a, "h1")).mode & 0o777).toBe(0o600);
    expect(idA.secretHash).toBe(secretHashOf(secret));
    await registerHost(
      database.db,
      { id: "h1", url: "http://127.0.0.1:1111", driver: "process", capacityMiB: 1024, secretHash: idA.secretHash },
      { dataDir: a },
    );
    expect(await row("h1")).toMatchObject({ secretHash: idA.secretHash, url: "http://127.0.0.1:1111" });

    const idB = openHostIdentity(b, "h1");
    expect(idB.secretHash).not.toBe(idA.secretHash);
    const before = await row("h1");
    for (const attempt of [
      () =>
        registerHost(database.db, { id: "h1", url: "http://127.0.0.1:2222", driver: "process", capacityMiB: 2048, secretHash: idB.secretHash }, { dataDir: b }),
      () => claimHost(database.db, { id: "h1", driver: "process", capacityMiB: 2048, secretHash: idB.secretHash }, { dataDir: b }),
    ]) {
      const err = await refusal(attempt());
      expect(err.message).toContain("host h1 is registered by another data directory (its secret differs");
      expect(err.message).toContain(hostSecretPath(b, "h1"));
      expect(err.message).toContain("delete from hosts where id='h1'");
      expect(err.message).toContain("another HOST_ID");
    }
    // Nothing of the refused starts reached the row.
    expect(await row("h1")).toEqual(before);
    idB.release();

    // The first data directory again, after a restart (lock released, the same secret read back).
    idA.release();
    const again = openHostIdentity(a, "h1");
    expect(again.secretHash).toBe(idA.secretHash);
    await claimHost(database.db, { id: "h1", driver: "process", capacityMiB: 1024, secretHash: again.secretHash }, { dataDir: a });
    await registerHost(
      database.db,
      { id: "h1", url: "http://127.0.0.1:3333", driver: "process", capacityMiB: 1024, secretHash: again.secretHash },
      { dataDir: a },
    );
    expect((await row("h1"))?.url).toBe("http://127.0.0.1:3333");
    again.release();
  });

  it("a row of an older version (no secret hash) is claimed, by the claim and by registration", async () => {
    await database.db.insert(hosts).values([
      { id: "h_old1", driver: "process", capacityMiB: 512, url: "http://127.0.0.1:4444" },
      { id: "h_old2", driver: "process", capacityMiB: 512, url: "http://127.0.0.1:5555" },
    ]);
    const dir = tempDir("old");
    const one = openHostIdentity(dir, "h_old1");
    await claimHost(database.db, { id: "h_old1", driver: "process", capacityMiB: 512, secretHash: one.secretHash }, { dataDir: dir });
    // The claim takes the row without touching what gateways read (its URL, its heartbeat) before the ingress answers.
    expect(await row("h_old1")).toMatchObject({ secretHash: one.secretHash, url: "http://127.0.0.1:4444" });
    const two = openHostIdentity(dir, "h_old2");
    await registerHost(database.db, { id: "h_old2", driver: "process", capacityMiB: 512, secretHash: two.secretHash }, { dataDir: dir });
    expect(await row("h_old2")).toMatchObject({ secretHash: two.secretHash, url: "http://127.0.0.1:5555" });
    // Claimed: a third data directory is now refused.
    const other = openHostIdentity(tempDir("other"), "h_old1");
    await refusal(claimHost(database.db, { id: "h_old1", driver: "process", capacityMiB: 512, secretHash: other.secretHash }, { dataDir: "x" }));
    for (const id of [one, two, other]) id.release();
  });

  it("one process per data directory: a held lock is refused, a dead holder's lock is taken over", async () => {
    const dir = tempDir("lock");
    const held = openHostIdentity(dir, "h_lock");
    const err = await refusal(() => openHostIdentity(dir, "h_lock"));
    expect(err.message).toBe(
      `host h_lock: another process (pid ${process.pid}) runs on the data directory ${dir} (it holds ${hostLockPath(dir, "h_lock")}); stop it first, or give this one another DATA_DIR and HOST_ID`,
    );
    held.release();
    expect(existsSync(hostLockPath(dir, "h_lock"))).toBe(false);

    // Left by a process that died (a pid that cannot run), and by an earlier process that had this process's pid.
    for (const pid of [2 ** 22 + 17, process.pid]) {
      writeFileSync(hostLockPath(dir, "h_lock"), String(pid));
      const taken = openHostIdentity(dir, "h_lock");
      expect(readFileSync(hostLockPath(dir, "h_lock"), "utf8")).toBe(String(process.pid));
      taken.release();
    }
  });

  it("a host id that is no plain directory name is refused", async () => {
    const err = await Promise.resolve()
      .then(() => openHostIdentity(tempDir("bad"), "../h1"))
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).message).toMatch(/HOST_ID "\.\.\/h1" must be/);
  });
});

describe("heartbeat", () => {
  it("reports the host's clock skew (10 min ahead: ≈600000 ms, an error on every beat) and its load; afterBeat runs, its failure is not fatal", async () => {
    const dir = tempDir("skew");
    const id = openHostIdentity(dir, "h_skew");
    const clock = aheadBy(600_000);
    const registered = await registerHost(
      database.db,
      { id: "h_skew", url: "http://127.0.0.1:6666", driver: "process", capacityMiB: 4096, secretHash: id.secretHash },
      { dataDir: dir, clock },
    );
    expect(Math.abs(registered.clockSkewMs - 600_000)).toBeLessThan(1000);
    let load = { usedMiB: 768, awakeAgents: 3 };
    let afterBeats = 0;
    const told: boolean[] = [];
    const { lines, log } = captured();
    const hb = startHeartbeat(database.db, "h_skew", 60_000, log, {
      secretHash: id.secretHash,
      clock,
      maxSkewMs: 2000,
      report: () => load,
      afterBeat: async (beat) => {
        told.push(beat.clockSkewed);
        afterBeats++;
        if (afterBeats === 2) throw new Error("fencing check failed");
      },
    });
    // Once at start, without waiting for the interval.
    await waitFor(async () => afterBeats >= 1, 5000, "the first beat");
    const first = await row("h_skew");
    expect(Math.abs(first!.clockSkewMs - 600_000)).toBeLessThan(1000);
    expect(first).toMatchObject({ usedMiB: 768, awakeAgents: 3 });
    load = { usedMiB: 256, awakeAgents: 1 };
    await hb.beat();
    await hb.beat();
    await hb.stop();
    const last = await row("h_skew");
    expect(last).toMatchObject({ usedMiB: 256, awakeAgents: 1 });
    expect(last!.lastHeartbeatAt.getTime()).toBeGreaterThan(first!.lastHeartbeatAt.getTime());
    expect(afterBeats).toBe(3);
    expect(told).toEqual([true, true, true]); // the host drains itself while its clock is off (host.ts afterHeartbeat)
    const skewErrors = lines.filter(
      (l) =>
        l.level === "error" &&
        /^this host's clock is \d+ ms ahead of the database's \(allowed 2000 ms\): it takes no new agents and drains its own until fixed$/.test(l.msg),
    );
    expect(skewErrors).toHaveLength(3);
    expect(Math.abs((skewErrors[0]!.clockSkewMs as number) - 600_000)).toBeLessThan(1000);
    expect(lines.filter((l) => l.msg === "heartbeat: afterBeat failed")).toHaveLength(1);
    id.release();
  });

  it("a clock behind is said so; an in-bounds clock logs no error and records a small skew", async () => {
    const dir = tempDir("behind");
    const id = openHostIdentity(dir, "h_behind");
    await registerHost(
      database.db,
      { id: "h_behind", url: "http://127.0.0.1:7777", driver: "process", capacityMiB: 4096, secretHash: id.secretHash },
      { dataDir: dir },
    );
    const behind = captured();
    const hb = startHeartbeat(database.db, "h_behind", 60_000, behind.log, { secretHash: id.secretHash, clock: aheadBy(-30_000), maxSkewMs: 2000 });
    await hb.beat();
    await hb.stop();
    expect(behind.lines.find((l) => l.level === "error")?.msg).toMatch(
      /^this host's clock is 3\d{4} ms behind the database's \(allowed 2000 ms\): it takes no new agents and drains its own until fixed$/,
    );
    expect((await row("h_behind"))!.clockSkewMs).toBeLessThan(-29_000);

    const fine = captured();
    const ok = startHeartbeat(database.db, "h_behind", 60_000, fine.log, { secretHash: id.secretHash, clock: systemClock, maxSkewMs: 2000 });
    await ok.beat();
    await ok.stop();
    expect(fine.lines.filter((l) => l.level === "error")).toEqual([]);
    // Postgres on loopback and this process share the machine's clock: the skew measured is the measurement's error.
    expect(Math.abs((await row("h_behind"))!.clockSkewMs)).toBeLessThan(200);
    expect(fine.lines.some((l) => /back within 2000 ms/.test(l.msg))).toBe(false);
    id.release();
  });

  it("a heartbeat after another secret took the row logs loudly, stops beating and calls onLost once", async () => {
    const dir = tempDir("lost");
    const id = openHostIdentity(dir, "h_lost");
    await registerHost(
      database.db,
      { id: "h_lost", url: "http://127.0.0.1:8888", driver: "process", capacityMiB: 4096, secretHash: id.secretHash },
      { dataDir: dir },
    );
    let lost = 0;
    const { lines, log } = captured();
    const hb = startHeartbeat(database.db, "h_lost", 60_000, log, { secretHash: id.secretHash, clock: systemClock, maxSkewMs: 2000, onLost: () => lost++ });
    await hb.beat();
    expect(lost).toBe(0);
    // The row deleted by an operator and registered by another data directory.
    await database.db.delete(hosts).where(eq(hosts.id, "h_lost"));
    const other = openHostIdentity(tempDir("thief"), "h_lost");
    await registerHost(
      database.db,
      { id: "h_lost", url: "http://127.0.0.1:9999", driver: "process", capacityMiB: 4096, secretHash: other.secretHash },
      { dataDir: "elsewhere" },
    );
    await database.db.update(hosts).set({ lastHeartbeatAt: sql`now() - interval '1 hour'` }).where(eq(hosts.id, "h_lost"));
    await hb.beat();
    await hb.beat();
    await hb.stop();
    expect(lost).toBe(1);
    expect(lines.filter((l) => l.level === "error" && l.msg.startsWith("another process took host h_lost's row"))).toHaveLength(1);
    // The other process's row is untouched by the beats that lost it.
    const taken = await row("h_lost");
    expect(taken).toMatchObject({ secretHash: other.secretHash, url: "http://127.0.0.1:9999" });
    expect(taken!.lastHeartbeatAt.getTime()).toBeLessThan(Date.now() - 3_000_000);
    id.release();
    other.release();
  });
});

describe("the fleet-agent daemon with a taken HOST_ID", () => {
  it("a second daemon with the same HOST_ID on another data directory exits non-zero with the message and meters nothing; one on the same data directory is refused too", async () => {
    const a = tempDir("daemon-a");
    const b = tempDir("daemon-b");
    const env = (dataDir: string) => ({
      DATABASE_URL: database.url,
      COMPONENT_SECRET: testComponentSecret,
      DATA_DIR: dataDir,
      HOST_ID: "host_twin",
      INGRESS_PORT: "0",
      DRIVER: "process",
      HEARTBEAT_INTERVAL_MS: "300",
      LOG_LEVEL: "info",
    });
    const ready = /fleet-agent (host_twin) serving gateways at (http:\/\/\S+)/;
    const first = await spawnNode("scripts/fleet-agent.ts", env(a), ready);
    children.push(first);
    const url = first.match[2];
    const registered = await row("host_twin");
    expect(registered?.url).toBe(url);

    const refused = await spawnNode("scripts/fleet-agent.ts", env(b), /never printed/, 30_000).then(
      () => undefined,
      (e: Error) => e.message,
    );
    expect(refused).toMatch(/exited \(1\) before it was ready/);
    expect(refused).toContain("host host_twin is registered by another data directory (its secret differs");
    expect(refused).toContain("delete from hosts where id='host_twin'");
    expect(refused).not.toMatch(/fleet-agent ready|serving gateways/);
    // Nothing of it ran: no meter spool, no VM directory; the row is still the first's, and the first still beats.
    expect(existsSync(meterDir(b, "host_twin"))).toBe(false);
    expect(existsSync(join(b, "hosts", "host_twin", "vms"))).toBe(false);
    expect(await row("host_twin")).toMatchObject({ url, secretHash: registered!.secretHash });
    const beatBefore = (await row("host_twin"))!.lastHeartbeatAt.getTime();
    await waitFor(async () => (await row("host_twin"))!.lastHeartbeatAt.getTime() > beatBefore, 5000, "the first host's next beat");
    const [segments] = await database.db.select({ n: count() }).from(meterSegments);
    const [conflicts] = await database.db.select({ n: count() }).from(meterConflicts);
    expect(segments!.n).toBe(0);
    expect(conflicts!.n).toBe(0);

    const sameDir = await spawnNode("scripts/fleet-agent.ts", env(a), /never printed/, 30_000).then(
      () => undefined,
      (e: Error) => e.message,
    );
    expect(sameDir).toMatch(/exited \(1\) before it was ready/);
    expect(sameDir).toContain(`host host_twin: another process (pid ${first.proc.pid}) runs on the data directory ${a}`);
    expect(first.proc.exitCode).toBeNull();

    // Stopped, the first releases its lock and its data directory starts again.
    expect(await first.stop()).toBe(0);
    expect(existsSync(hostLockPath(a, "host_twin"))).toBe(false);
    const restarted = await spawnNode("scripts/fleet-agent.ts", env(a), ready);
    children.push(restarted);
    expect((await row("host_twin"))?.url).toBe(restarted.match[2]);
  }, 120_000);
});
