// Ships hibernated VMs through the artifact store: commit = checkpoint the snapshot, put its files, record the commit row;
// materialize = the committed files back into a checkpoint directory on any host, which the driver then restores.
//
// What a host death can lose: the hibernations since the agent's last commit (a commit runs after each hibernation,
// asynchronously: the host's own snapshot is enough to wake on the same host). The commit row is written only after
// every blob is in the store, so a row never names a blob that is not there.
import { randomBytes } from "node:crypto";
import { mkdir, readdir, rm, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { AgentSpec } from "../../contracts/agent.ts";
import { AppError } from "../../lib/errors.ts";
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import type { VmDriver, VmSpec } from "../drivers/driver.ts";
import type { CommitRow, CommitStore } from "./commits.ts";
import type { ArtifactStore } from "./store.ts";

export interface CommitArgs {
  spec: AgentSpec;
  /** The hibernated VM (its stateDir holds the snapshot to ship). */
  vmSpec: VmSpec;
  /** The lease generation the host runs the agent under: the fence of the commit row. */
  generation: number;
  /** When the snapshot was taken (the hibernation): a commit of an older one never replaces a newer one. */
  snapshotAt: Date;
}

export interface CommitResult {
  row: CommitRow;
  /** Whether the row became the agent's commit (false: a newer one was there, of a newer generation or snapshot). */
  won: boolean;
  /** Bytes of blobs this commit added to the store; the rest of `row.bytes` were there already (deduplicated). */
  bytesAdded: number;
  /** Bytes this commit wrote into the store: `bytesAdded` without the holes of sparse files (a RAM file's untouched pages). */
  bytesWritten: number;
  /** Copying the snapshot into the staging checkpoint (under `exclusive`), putting its files, and the whole, ms. */
  checkpointMs: number;
  putMs: number;
  ms: number;
}

export interface SnapshotShipperOptions {
  store: ArtifactStore;
  commits: CommitStore;
  driver: VmDriver;
  /** Host-local directory for the checkpoints being shipped (each removed once its files are in the store). */
  stagingDir: string;
  /** The host that commits (the row's `host_id`). */
  hostId: string;
  log: Logger;
  clock: Clock;
  /**
   * Runs the checkpoint step apart from the agent's wakes and snapshots (the host's per-agent queue, `KeyedQueue.run`):
   * the checkpoint reads the VM's snapshot files, which a wake or the next hibernation changes. The store puts run
   * outside it, from the immutable staging copy. Default: runs it directly (the caller keeps the VM still).
   */
  exclusive?: <T>(agentId: string, work: () => Promise<T>) => Promise<T>;
}

export interface SnapshotShipper {
  /**
   * Commits the hibernated VM's snapshot. One commit per agent at a time; a request made while one runs waits, and a
   * newer request replaces a waiting one (latest wins: both callers get the newer one's result). Answers undefined when
   * the driver cannot checkpoint (the process driver: no memory to ship). Rejects when the commit failed (no row was
   * written, what was put stays in the store for a later commit to reuse); the failure is logged, so a caller need
   * not wait for it.
   */
  commit(args: CommitArgs): Promise<CommitResult | undefined>;
  /** Settles once every commit requested so far (and any requested while waiting) has settled. */
  flush(): Promise<void>;
  /** The agent's waiting or running commit, if any. */
  pending(agentId: string): Promise<CommitResult | undefined> | undefined;
  /**
   * Writes the agent's committed files into `dir` (which must not exist; created here) as the checkpoint directory
   * they came from, every blob verified; answers the row, or undefined when the agent has no commit. On failure `dir`
   * is removed and the error thrown (AppError `not_found`/`internal` from the store). The caller then runs
   * `driver.restoreCheckpoint(vmSpec, dir)` and removes `dir`.
   */
  materialize(agentId: string, dir: string): Promise<CommitRow | undefined>;
}

interface Waiting {
  args: CommitArgs;
  promise: Promise<CommitResult | undefined>;
  resolve: (r: CommitResult | undefined) => void;
  reject: (err: unknown) => void;
}

interface Lane {
  running: Promise<CommitResult | undefined>;
  waiting?: Waiting;
}

/** A file name of a checkpoint directory as a row may hold it: one plain name, nothing that walks out of `dir`. */
const FILE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function createSnapshotShipper(opts: SnapshotShipperOptions): SnapshotShipper {
  const { store, commits, driver, log, clock } = opts;
  const exclusive = opts.exclusive ?? ((_id, work) => work());
  const lanes = new Map<string, Lane>();
  let saidUnsupported = false;

  async function ship(args: CommitArgs): Promise<CommitResult> {
    const agentId = args.spec.id;
    const started = clock.monotonic();
    await mkdir(opts.stagingDir, { recursive: true });
    const dir = join(opts.stagingDir, `${agentId}-${randomBytes(4).toString("hex")}`);
    try {
      await exclusive(agentId, () => driver.checkpoint!(args.vmSpec, undefined, dir));
      const checkpointMs = clock.monotonic() - started;
      const files: CommitRow["files"] = {};
      let bytes = 0;
      let bytesAdded = 0;
      let bytesWritten = 0;
      for (const name of (await readdir(dir)).sort()) {
        const put = await store.put(join(dir, name));
        files[name] = { digest: put.digest, bytes: put.bytes };
        bytes += put.bytes;
        if (put.added) bytesAdded += put.bytes;
        bytesWritten += put.written;
      }
      const putMs = clock.monotonic() - started - checkpointMs;
      const row: CommitRow = {
        agentId,
        hostId: opts.hostId,
        generation: args.generation,
        files,
        bytes,
        snapshotAt: args.snapshotAt,
        committedAt: new Date(clock.now()),
      };
      const won = await commits.upsert(row);
      const ms = clock.monotonic() - started;
      const fields = {
        agentId,
        generation: args.generation,
        snapshotAt: args.snapshotAt.toISOString(),
        bytes,
        bytesAdded,
        bytesWritten,
        checkpointMs: Math.round(checkpointMs),
        putMs: Math.round(putMs),
        ms: Math.round(ms),
      };
      if (won) log.info("snapshot committed to the artifact store", fields);
      else log.warn("snapshot commit lost: the agent has a newer commit (a newer generation or snapshot)", fields);
      return { row, won, bytesAdded, bytesWritten, checkpointMs, putMs, ms };
    } catch (err) {
      log.warn("snapshot commit failed", { agentId, generation: args.generation, err });
      throw err;
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  function start(agentId: string, args: CommitArgs): Promise<CommitResult | undefined> {
    const running = ship(args);
    lanes.set(agentId, { running });
    const next = () => {
      const lane = lanes.get(agentId);
      if (lane?.running !== running) return;
      const w = lane.waiting;
      if (!w) {
        lanes.delete(agentId);
        return;
      }
      start(agentId, w.args).then(w.resolve, w.reject);
    };
    running.then(next, next);
    return running;
  }

  return {
    commit(args) {
      if (!driver.checkpoint) {
        if (!saidUnsupported) log.info("snapshots are not shipped to the artifact store: the driver cannot checkpoint", { driver: driver.name });
        saidUnsupported = true;
        return Promise.resolve(undefined);
      }
      const agentId = args.spec.id;
      const lane = lanes.get(agentId);
      if (!lane) return start(agentId, args);
      if (lane.waiting) {
        lane.waiting.args = args;
        return lane.waiting.promise;
      }
      let resolve!: Waiting["resolve"];
      let reject!: Waiting["reject"];
      const promise = new Promise<CommitResult | undefined>((res, rej) => {
        resolve = res;
        reject = rej;
      });
      // Handled here so a caller that does not wait raises no unhandled rejection (ship() logged the failure).
      promise.catch(() => {});
      lane.waiting = { args, promise, resolve, reject };
      return promise;
    },

    async flush() {
      while (lanes.size > 0) await Promise.allSettled([...lanes.values()].map((l) => l.waiting?.promise ?? l.running));
    },

    pending(agentId) {
      const lane = lanes.get(agentId);
      return lane?.waiting?.promise ?? lane?.running;
    },

    async materialize(agentId, dir) {
      const row = await commits.get(agentId);
      if (!row) return undefined;
      const started = clock.monotonic();
      await mkdir(dirname(dir), { recursive: true });
      await mkdir(dir);
      try {
        for (const [name, f] of Object.entries(row.files)) {
          if (!FILE_NAME.test(name)) throw new AppError("internal", `agent ${agentId}'s commit names a file "${name.slice(0, 80)}" that is no checkpoint file`);
          const path = join(dir, name);
          await store.get(f.digest, path);
          const size = (await stat(path)).size;
          if (size !== f.bytes) throw new AppError("internal", `artifact ${f.digest} (${name}) holds ${size} bytes, agent ${agentId}'s commit says ${f.bytes}`);
        }
      } catch (err) {
        await rm(dir, { recursive: true, force: true });
        log.warn("materializing the committed snapshot failed", { agentId, generation: row.generation, err });
        throw err;
      }
      log.info("committed snapshot materialized", { agentId, generation: row.generation, bytes: row.bytes, ms: Math.round(clock.monotonic() - started) });
      return row;
    },
  };
}
