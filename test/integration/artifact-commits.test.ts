// Commit rows on real Postgres: the generation and snapshot-time fence of agent_commits; and the snapshot shipper over
// the directory store and a driver whose checkpoint copies files: commit, dedup, latest-wins queue, materialize elsewhere.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { AgentSpec } from "../../contracts/agent.ts";
import { createDbCommitStore, type CommitRow, type CommitStore } from "../../fleet-agent/artifacts/commits.ts";
import { createDirArtifactStore } from "../../fleet-agent/artifacts/dir-store.ts";
import { createSnapshotShipper } from "../../fleet-agent/artifacts/shipper.ts";
import type { VmDriver, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { ManualClock } from "../../lib/clock.ts";
import { newId } from "../../lib/ids.ts";
import { createLogger } from "../../lib/log.ts";
import { agents, tenants } from "../../schema/core.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";

let database: Database;
let commits: CommitStore;
const root = mkdtempSync(join(tmpdir(), "artifact-commits-"));

beforeAll(async () => {
  database = await freshDatabase();
  commits = createDbCommitStore(database.db);
  await database.db.insert(tenants).values({ id: "ten_ship", name: "ship" });
});
afterAll(async () => {
  await database?.close();
  rmSync(root, { recursive: true, force: true });
});

async function agent(): Promise<string> {
  const id = newId("agent");
  await database.db.insert(agents).values({ id, tenantId: "ten_ship", name: "a", image: "demo" });
  return id;
}

const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s));
const row = (agentId: string, o: Partial<CommitRow>): CommitRow => ({
  agentId,
  hostId: "host_a",
  generation: 1,
  files: { "state.bin": { digest: `sha256:${"1".repeat(64)}`, bytes: 10 } },
  bytes: 10,
  snapshotAt: at(10),
  committedAt: at(11),
  ...o,
});

describe("agent_commits upsert", () => {
  it("the first commit wins; a later snapshot of the same or a newer generation replaces it; the row reads back whole", async () => {
    const id = await agent();
    expect(await commits.get(id)).toBeUndefined();
    expect(await commits.upsert(row(id, {}))).toBe(true);
    expect(await commits.get(id)).toEqual(row(id, {}));
    const later = row(id, { snapshotAt: at(20), committedAt: at(21), files: { ram: { digest: `sha256:${"2".repeat(64)}`, bytes: 5 } }, bytes: 5 });
    expect(await commits.upsert(later)).toBe(true);
    expect(await commits.get(id)).toEqual(later);
    const moved = row(id, { hostId: "host_b", generation: 2, snapshotAt: at(30), committedAt: at(31) });
    expect(await commits.upsert(moved)).toBe(true);
    expect(await commits.get(id)).toMatchObject({ hostId: "host_b", generation: 2, snapshotAt: at(30) });
  });

  it("a stale host (older generation) never overwrites, however late its snapshot; nor does an older or the same snapshot", async () => {
    const id = await agent();
    const current = row(id, { hostId: "host_b", generation: 3, snapshotAt: at(30) });
    expect(await commits.upsert(current)).toBe(true);
    // The host that lost the agent at generation 2 commits a snapshot it took after the move.
    expect(await commits.upsert(row(id, { hostId: "host_a", generation: 2, snapshotAt: at(50) }))).toBe(false);
    // The owner's own slow commit of an earlier hibernation, and the same snapshot again.
    expect(await commits.upsert(row(id, { hostId: "host_b", generation: 3, snapshotAt: at(20) }))).toBe(false);
    expect(await commits.upsert(row(id, { hostId: "host_b", generation: 3, snapshotAt: at(30), bytes: 99 }))).toBe(false);
    // A newer generation whose snapshot is not newer (clocks of two hosts apart) loses too: both conditions must hold.
    expect(await commits.upsert(row(id, { hostId: "host_c", generation: 4, snapshotAt: at(25) }))).toBe(false);
    expect(await commits.get(id)).toEqual(current);
  });

  it("racing upserts of one agent: exactly the newest lands, whatever the order they reach Postgres in", async () => {
    const id = await agent();
    const rows = Array.from({ length: 12 }, (_, i) => row(id, { generation: 1 + Math.floor(i / 4), snapshotAt: at(10 + i), hostId: `host_${i}` }));
    const won = await Promise.all(rows.sort(() => Math.random() - 0.5).map((r) => commits.upsert(r)));
    expect(won.filter(Boolean).length).toBeGreaterThanOrEqual(1);
    expect(await commits.get(id)).toMatchObject({ generation: 3, snapshotAt: at(21), hostId: "host_11" });
  });
});

/**
 * A driver whose checkpoint of a hibernated VM copies the stateDir's files (`state.bin`, `ram`) and a manifest into
 * the directory, after `gate` (when set) lets it go; restoreCheckpoint is not needed here.
 */
function copyingDriver() {
  const calls: string[] = [];
  let gate: Promise<void> | undefined;
  const driver = {
    name: "qemu",
    isolated: true,
    async checkpoint(spec: VmSpec, vm: unknown, dir: string) {
      expect(vm).toBeUndefined();
      calls.push(readFileSync(join(spec.stateDir, "state.bin"), "utf8"));
      await gate;
      await mkdir(dir);
      for (const name of ["state.bin", "ram"]) await writeFile(join(dir, name), readFileSync(join(spec.stateDir, name)));
      await writeFile(join(dir, "checkpoint.json"), JSON.stringify({ agentId: spec.agentId }));
      return { bytes: 0, pausedMs: 0, ms: 0, copy: "copy" as const };
    },
  } as unknown as VmDriver;
  return {
    driver,
    calls,
    hold() {
      let release!: () => void;
      gate = new Promise((r) => (release = r));
      return () => {
        gate = undefined;
        release();
      };
    },
  };
}

describe("the snapshot shipper over the directory store", () => {
  const store = createDirArtifactStore({ root: join(root, "store") });
  const clock = new ManualClock();
  const log = createLogger({ level: "error" });
  const vmOf = (agentId: string, host: string): VmSpec => ({
    vmId: `vm_${agentId}`,
    agentId,
    image: "demo",
    vcpus: 1,
    memMiB: 256,
    allowEgress: false,
    stateDir: join(root, host, agentId),
  });
  const specOf = (id: string): AgentSpec => ({
    id,
    tenantId: "ten_ship",
    image: "demo",
    vcpus: 1,
    memMiB: 256,
    idleTimeoutMs: 1000,
    streamIdleMs: 1000,
    allowEgress: false,
  });
  const hibernate = (vm: VmSpec, state: string, ram: Buffer) => {
    mkdirSync(vm.stateDir, { recursive: true });
    writeFileSync(join(vm.stateDir, "state.bin"), state);
    writeFileSync(join(vm.stateDir, "ram"), ram);
  };

  it("commits every file by digest, records the row, dedups unchanged files, and materializes them on another host", async () => {
    const { driver } = copyingDriver();
    const shipper = createSnapshotShipper({ store, commits, driver, stagingDir: join(root, "a", "staging"), hostId: "host_a", log, clock });
    const id = await agent();
    const vm = vmOf(id, "a");
    const ram = Buffer.alloc(4 << 20, 7);
    hibernate(vm, "state one", ram);
    const first = await shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 1, snapshotAt: at(10) });
    expect(first?.won).toBe(true);
    expect(Object.keys(first!.row.files).sort()).toEqual(["checkpoint.json", "ram", "state.bin"]);
    expect(first!.row.bytes).toBe(ram.length + "state one".length + first!.row.files["checkpoint.json"]!.bytes);
    expect(first!.bytesAdded).toBe(first!.row.bytes);
    expect(await commits.get(id)).toEqual(first!.row);
    expect(readdirSync(join(root, "a", "staging"))).toEqual([]); // the staging checkpoint is gone

    // The next hibernation changed the state but not the RAM: only the new bytes are put.
    hibernate(vm, "state two", ram);
    const second = await shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 1, snapshotAt: at(20) });
    expect(second?.won).toBe(true);
    expect(second!.row.files.ram).toEqual(first!.row.files.ram);
    expect(second!.bytesAdded).toBe("state two".length); // checkpoint.json is the same bytes: deduplicated too
    expect(second!.bytesWritten).toBe("state two".length);
    expect(first!.bytesWritten).toBe(first!.bytesAdded); // nothing sparse in these: every byte written

    // Host B (its own shipper, same store and database) materializes the agent.
    const onB = createSnapshotShipper({ store, commits, driver, stagingDir: join(root, "b", "staging"), hostId: "host_b", log, clock });
    const dir = join(root, "b", "incoming", id);
    const got = await onB.materialize(id, dir);
    expect(got).toEqual(second!.row);
    expect(readFileSync(join(dir, "state.bin"), "utf8")).toBe("state two");
    expect(readFileSync(join(dir, "ram")).equals(ram)).toBe(true);
    expect(await onB.materialize(await agent(), join(root, "b", "none"))).toBeUndefined();
    expect(existsSync(join(root, "b", "none"))).toBe(false);

    // A corrupted blob: materialize throws and leaves no directory behind.
    const blob = store.blobPath(second!.row.files.ram!.digest);
    const good = readFileSync(blob);
    writeFileSync(blob, Buffer.concat([good.subarray(0, 100), Buffer.from([good[100]! ^ 1]), good.subarray(101)]));
    const bad = join(root, "b", "incoming", `${id}-bad`);
    await expect(onB.materialize(id, bad)).rejects.toMatchObject({ code: "internal" });
    expect(existsSync(bad)).toBe(false);
    writeFileSync(blob, good);
  });

  it("one commit per agent at a time; a newer request replaces a waiting one; flush waits for all; a stale generation loses", async () => {
    const fake = copyingDriver();
    const shipper = createSnapshotShipper({ store, commits, driver: fake.driver, stagingDir: join(root, "q", "staging"), hostId: "host_q", log, clock });
    const id = await agent();
    const vm = vmOf(id, "q");
    const release = fake.hold();
    hibernate(vm, "s1", Buffer.from("r"));
    const p1 = shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 5, snapshotAt: at(1) });
    await new Promise((r) => setTimeout(r, 20));
    expect(fake.calls).toEqual(["s1"]); // the first is checkpointing (held)
    const p2 = shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 5, snapshotAt: at(2) });
    const p3 = shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 5, snapshotAt: at(3) });
    expect(p3).toBe(p2); // waiting: replaced in place, both callers share the newer one's result
    expect(shipper.pending(id)).toBe(p3);
    hibernate(vm, "s3", Buffer.from("r"));
    release();
    await shipper.flush();
    expect(shipper.pending(id)).toBeUndefined();
    expect(fake.calls).toEqual(["s1", "s3"]); // the request for snapshot 2 never ran
    expect((await p1)?.row.snapshotAt).toEqual(at(1));
    expect((await p2)?.row.snapshotAt).toEqual(at(3));
    expect(await commits.get(id)).toMatchObject({ snapshotAt: at(3), generation: 5 });

    const stale = await shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 4, snapshotAt: at(9) });
    expect(stale?.won).toBe(false);
    expect(await commits.get(id)).toMatchObject({ snapshotAt: at(3), generation: 5 });
  });

  it("runs the checkpoint step under `exclusive` (the host's per-agent queue) and the puts and the row after it", async () => {
    const fake = copyingDriver();
    const order: string[] = [];
    const tracking = {
      ...fake.driver,
      checkpoint: async (...a: Parameters<NonNullable<VmDriver["checkpoint"]>>) => (order.push("checkpoint"), fake.driver.checkpoint!(...a)),
    } as VmDriver;
    const tracked: CommitStore = { upsert: async (r) => (order.push("upsert"), commits.upsert(r)), get: (id) => commits.get(id) };
    const exclusive = async <T>(agentId: string, work: () => Promise<T>): Promise<T> => {
      order.push(`enter ${agentId}`);
      try {
        return await work();
      } finally {
        order.push(`leave ${agentId}`);
      }
    };
    const shipper = createSnapshotShipper({
      store,
      commits: tracked,
      driver: tracking,
      stagingDir: join(root, "x", "staging"),
      hostId: "host_x",
      log,
      clock,
      exclusive,
    });
    const id = await agent();
    const vm = vmOf(id, "x");
    hibernate(vm, "x", Buffer.from("y"));
    expect((await shipper.commit({ spec: specOf(id), vmSpec: vm, generation: 1, snapshotAt: at(1) }))?.won).toBe(true);
    expect(order).toEqual([`enter ${id}`, "checkpoint", `leave ${id}`, "upsert"]);
  });

  it("a driver that cannot checkpoint ships nothing: commit answers undefined", async () => {
    const lines: string[] = [];
    const driver = { name: "process", isolated: false } as unknown as VmDriver;
    const shipper = createSnapshotShipper({
      store,
      commits,
      driver,
      stagingDir: join(root, "p"),
      hostId: "host_p",
      log: createLogger({ write: (l) => lines.push(l) }),
      clock,
    });
    const id = await agent();
    expect(await shipper.commit({ spec: specOf(id), vmSpec: vmOf(id, "p"), generation: 1, snapshotAt: at(1) })).toBeUndefined();
    expect(await shipper.commit({ spec: specOf(id), vmSpec: vmOf(id, "p"), generation: 1, snapshotAt: at(2) })).toBeUndefined();
    expect(lines.filter((l) => l.includes("cannot checkpoint"))).toHaveLength(1);
    expect(await commits.get(id)).toBeUndefined();
  });
});
