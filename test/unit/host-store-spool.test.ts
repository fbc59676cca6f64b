// The host's store while Postgres is away: event-log writes are spooled on disk (fsynced), replayed in order when it is back, across restarts too.
import { afterEach, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, appendFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import { EventLog } from "../../fleet-agent/event-log.ts";
import { createSpooledHostStore } from "../../fleet-agent/store-spool.ts";
import { createMemoryHostStore, type HostStore, type RunStart, type TransitionRecord } from "../../fleet-agent/store.ts";
import { asDatabaseError, isDatabaseUnavailable } from "../../schema/db-errors.ts";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function tempDir(): string {
  const d = mkdtempSync(join(tmpdir(), "agentvm-store-spool-"));
  dirs.push(d);
  return join(d, "events");
}

/** What postgres.js rejects a query with while the server is down. */
const refused = () => Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED", errno: -111, syscall: "connect" });
/** A server's error: postgres.js copies the fields of the ErrorResponse (severity, code, …) onto the error. */
const serverError = (code: string, message: string) => Object.assign(new Error(message), { name: "PostgresError", severity: "ERROR", code });

function record(toState: string, at = 0): TransitionRecord {
  return {
    at: new Date(Date.UTC(2026, 0, 1) + at),
    hostId: "host_t",
    agentId: "agt_a",
    tenantId: "ten_a",
    vmId: "vm_a",
    runId: null,
    fromState: "x",
    toState,
    reason: "request",
    timings: null,
    detail: null,
  };
}
const run: RunStart = {
  id: "run_1",
  agentId: "agt_a",
  tenantId: "ten_a",
  hostId: "host_t",
  vmId: "vm_a",
  wokeAt: new Date(Date.UTC(2026, 0, 1)),
  wakeReason: "request",
  wakeMode: "boot",
  timings: { bootMs: 5 },
};

/** A memory store behind a switch: `down` makes every write fail like a stopped Postgres; `refuse` fails one state for good. */
function switchedStore() {
  const memory = createMemoryHostStore();
  const state = { down: false, refuse: undefined as string | undefined, duplicate: undefined as string | undefined };
  const guard = () => {
    if (state.down) throw refused();
  };
  const store: HostStore = {
    ...memory,
    async transition(r) {
      guard();
      if (r.toState === state.refuse) throw serverError("23503", "insert violates foreign key constraint");
      if (r.toState === state.duplicate) throw serverError("23505", "duplicate key value violates unique constraint");
      await memory.transition(r);
    },
    async runStarted(r) {
      guard();
      await memory.runStarted(r);
    },
    async runTimings(id, t) {
      guard();
      await memory.runTimings(id, t);
    },
    async runEnded(id, at, reason) {
      guard();
      await memory.runEnded(id, at, reason);
    },
  };
  return { store, memory, state };
}

describe("classifying database errors", () => {
  it("connection failures, timeouts and shutdowns are `database_unavailable`; other errors are not", () => {
    expect(isDatabaseUnavailable(refused())).toBe(true);
    expect(isDatabaseUnavailable(Object.assign(new Error("write CONNECT_TIMEOUT 10.0.0.1:5432"), { code: "CONNECT_TIMEOUT" }))).toBe(true);
    expect(isDatabaseUnavailable(serverError("57P01", "terminating connection due to administrator command"))).toBe(true);
    expect(isDatabaseUnavailable(serverError("57014", "canceling statement due to statement timeout"))).toBe(true);
    expect(isDatabaseUnavailable(serverError("08006", "connection failure"))).toBe(true);
    // drizzle wraps the driver's error as its cause
    expect(isDatabaseUnavailable(Object.assign(new Error("Failed query: select 1"), { cause: refused() }))).toBe(true);
    expect(isDatabaseUnavailable(serverError("23505", "duplicate key"))).toBe(false);
    expect(isDatabaseUnavailable(new Error("boom"))).toBe(false);
    // a fetch that failed to connect is not the database
    expect(isDatabaseUnavailable(new TypeError("fetch failed", { cause: refused() }))).toBe(false);
    const mapped = asDatabaseError(refused()) as { code: string; status: number; retryAfterS: number; message: string };
    expect(mapped).toMatchObject({ code: "database_unavailable", status: 503, retryAfterS: 2 });
    expect(mapped.message).not.toMatch(/127\.0\.0\.1/); // callers are not told where the database is
  });
});

describe("spooled host store", () => {
  it("writes go straight through while the database answers, and nothing is kept on disk", async () => {
    const { store, memory } = switchedStore();
    const dir = tempDir();
    const spooled = createSpooledHostStore(store, { dir, log: silentLogger, clock: new ManualClock() });
    await spooled.transition(record("booting"));
    await spooled.runStarted(run);
    expect(memory.transitions.map((t) => t.toState)).toEqual(["booting"]);
    expect(memory.runs.get("run_1")?.wakeMode).toBe("boot");
    expect(spooled.backlog).toBe(0);
    expect(statSync(join(dir, "store.ndjson")).size).toBe(0);
  });

  it("while the database is down writes are spooled, durable before they resolve; once it is back they land in order", async () => {
    const { store, memory, state } = switchedStore();
    const dir = tempDir();
    const clock = new ManualClock();
    const spooled = createSpooledHostStore(store, { dir, log: silentLogger, clock, random: () => 0.999 });
    await spooled.transition(record("booting", 1));
    state.down = true;
    await spooled.transition(record("running", 2));
    await spooled.runStarted(run);
    await spooled.runTimings("run_1", { bootMs: 5, firstByteMs: 9 });
    await spooled.transition(record("snapshotting", 3));
    await spooled.transition(record("hibernated", 4));
    await spooled.runEnded("run_1", new Date(Date.UTC(2026, 0, 1) + 4), "idle");
    expect(spooled.backlog).toBe(6);
    // On disk already (each line fsynced before its call resolved): what a kill now would leave.
    expect(readFileSync(join(dir, "store.ndjson"), "utf8").trim().split("\n")).toHaveLength(6);

    // Replays keep failing while it is down, backing off; nothing is lost or reordered.
    clock.advance(5000);
    await spooled.replay();
    expect(spooled.backlog).toBe(6);

    state.down = false;
    // A write issued while older ones wait goes behind them, not around them.
    const late = spooled.transition(record("restoring", 5));
    await late;
    expect(memory.transitions.map((t) => t.toState)).toEqual(["booting"]);
    clock.advance(2000); // the next replay is due within the backoff ceiling
    await spooled.replay();
    expect(spooled.backlog).toBe(0);
    expect(memory.transitions.map((t) => t.toState)).toEqual(["booting", "running", "snapshotting", "hibernated", "restoring"]);
    expect(memory.transitions[1]!.at).toEqual(new Date(Date.UTC(2026, 0, 1) + 2)); // Dates come back as Dates
    expect(memory.runs.get("run_1")).toMatchObject({ sleepReason: "idle", sleptAt: new Date(Date.UTC(2026, 0, 1) + 4), timings: { firstByteMs: 9 } });
    expect(statSync(join(dir, "store.ndjson")).size).toBe(0);
    // From now on writes go through again.
    await spooled.transition(record("running", 6));
    expect(memory.transitions.at(-1)!.toState).toBe("running");
  });

  it("the replay runs by itself on its timer once the database is back", async () => {
    const { store, memory, state } = switchedStore();
    const clock = new ManualClock();
    const spooled = createSpooledHostStore(store, { dir: tempDir(), log: silentLogger, clock, minBackoffMs: 100, maxBackoffMs: 400, random: () => 0.999 });
    state.down = true;
    await spooled.transition(record("running"));
    state.down = false;
    clock.advance(450);
    await new Promise((r) => setImmediate(r));
    expect(memory.transitions.map((t) => t.toState)).toEqual(["running"]);
    expect(spooled.backlog).toBe(0);
  });

  it("a write the database refuses for another reason is thrown when live, and set aside (rejected.ndjson) when replayed", async () => {
    const { store, memory, state } = switchedStore();
    const dir = tempDir();
    const spooled = createSpooledHostStore(store, { dir, log: silentLogger, clock: new ManualClock() });
    state.refuse = "failed";
    await expect(spooled.transition(record("failed"))).rejects.toThrow(/foreign key/);
    state.down = true;
    await spooled.transition(record("booting"));
    await spooled.transition(record("failed"));
    await spooled.transition(record("running"));
    state.duplicate = "running"; // landed before its connection died: the replay counts it as done
    state.down = false;
    expect(await spooled.replay()).toBe(true);
    expect(memory.transitions.map((t) => t.toState)).toEqual(["booting"]);
    const rejected = readFileSync(join(dir, "rejected.ndjson"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { method: string; error: string });
    expect(rejected).toEqual([expect.objectContaining({ method: "transition", error: expect.stringMatching(/foreign key/) })]);
  });

  it("what a killed process spooled is replayed by the next one: done writes are not repeated, a torn last line is dropped", async () => {
    const { store, memory, state } = switchedStore();
    const dir = tempDir();
    state.down = true;
    const first = createSpooledHostStore(store, { dir, log: silentLogger, clock: new ManualClock() });
    await first.transition(record("running", 1));
    await first.runStarted(run);
    await first.transition(record("hibernated", 2));
    first.close();
    // The first line had reached the database before the kill; the kill tore a line being written.
    appendFileSync(join(dir, "store.ndjson"), `${JSON.stringify({ done: 1 })}\n{"n":9,"m":"transi`);
    memory.transitions.push(record("running", 1));

    state.down = false;
    const errors: string[] = [];
    const log: Logger = { ...silentLogger, error: (m) => void errors.push(m) };
    const second = createSpooledHostStore(store, { dir, log, clock: new ManualClock() });
    expect(second.backlog).toBe(2);
    expect(second.corruptLines).toBe(0);
    expect(await second.replay()).toBe(true);
    expect(memory.transitions.map((t) => t.toState)).toEqual(["running", "hibernated"]);
    expect(memory.runs.get("run_1")?.wokeAt).toEqual(run.wokeAt);
    expect(errors).toEqual([]);
    expect(statSync(join(dir, "store.ndjson")).size).toBe(0);
  });

  it("unreadable lines are counted and skipped, the rest replayed", async () => {
    const { store, memory } = switchedStore();
    const dir = tempDir();
    createSpooledHostStore(store, { dir, log: silentLogger, clock: new ManualClock() }).close();
    writeFileSync(
      join(dir, "store.ndjson"),
      `not json\n${JSON.stringify({ n: 1, m: "transition", a: [{ ...record("running"), at: { $date: "2026-01-01T00:00:00.000Z" } }] })}\n`,
    );
    const spooled = createSpooledHostStore(store, { dir, log: silentLogger, clock: new ManualClock() });
    expect(spooled.corruptLines).toBe(1);
    await spooled.replay();
    expect(memory.transitions.map((t) => [t.toState, t.at.toISOString()])).toEqual([["running", "2026-01-01T00:00:00.000Z"]]);
  });

  it("methods it does not spool (reads, crash recovery) pass through, after the writes waiting before them", async () => {
    const { store, memory, state } = switchedStore();
    const spooled = createSpooledHostStore(store, { dir: tempDir(), log: silentLogger, clock: new ManualClock() });
    state.down = true;
    await spooled.runStarted(run);
    state.down = false;
    const left = await spooled.leftovers("host_t", new Date(Date.UTC(2027, 0, 1)));
    expect(left.openRuns.map((r) => r.id)).toEqual(["run_1"]); // the spooled run was written first
    expect(memory.runs.has("run_1")).toBe(true);
  });

  it("under the event log, an outage logs no failed write and loses no transition", async () => {
    const { store, memory, state } = switchedStore();
    const errors: string[] = [];
    const log: Logger = { ...silentLogger, error: (m) => void errors.push(m) };
    const spooled = createSpooledHostStore(store, { dir: tempDir(), log, clock: new ManualClock() });
    const events = new EventLog(spooled, log);
    events.transition(record("running"));
    await events.flush();
    state.down = true;
    events.transition(record("snapshotting"));
    events.transition(record("hibernated"));
    events.runEnded("run_1", new Date(1), "idle");
    await events.flush();
    expect(errors).toEqual([]);
    state.down = false;
    await spooled.replay();
    expect(memory.transitions.map((t) => t.toState)).toEqual(["running", "snapshotting", "hibernated"]);
  });
});
