// A host's upstream path put together: the owner of each VM from the host, the tenant's upstreams and the operation records from Postgres, kept bodies in the artifact store (or the data directory), bound into the proxy's slot; and the runner of async calls.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import { importSealKey } from "../../lib/seal.ts";
import type { Db } from "../../schema/db.ts";
import { createDirArtifactStore } from "../artifacts/dir-store.ts";
import type { UpstreamConfig } from "../egress/config.ts";
import { UpstreamCalls, type AsyncCalls, type DestinationCheck, type QueuedOperation, type UpstreamSlot, type VmOwner } from "../egress/upstreams.ts";
import { createDbAsyncOperationStore, type AsyncOperationStore, type OperationRow } from "../operations/async-store.ts";
import { AsyncOperationRunner } from "../operations/async-runner.ts";
import { createAsyncCall } from "./async-call.ts";
import { createBodyKeeper } from "./bodies.ts";
import { createUpstreamDirectory } from "./directory.ts";
import { createOperationJournal } from "./journal.ts";

/** What a program hands the host runtime so its VMs reach their tenants' upstreams (compose/). */
export interface HostUpstreams {
  /** The slot in the driver's egress proxy (fleet-agent/drivers/select.ts). */
  slot: UpstreamSlot;
  config: UpstreamConfig;
  /** The 32-byte upstream key (UPSTREAM_KEY_FILE). */
  key: Uint8Array;
  /** The proxy's destination check (policy.ts over every resolved address), for calls the host makes on its own. */
  destination: DestinationCheck;
}

/** How often a host looks for async calls to make when none was queued here, and how long its claim on one lasts (renewed every third). */
const asyncPollMs = 1000;
const asyncLeaseMs = 30_000;

export function serveUpstreams(
  u: HostUpstreams,
  opts: {
    db: Db;
    owner: (vmId: string) => VmOwner | undefined;
    hostId: string;
    dataDir: string;
    /** ARTIFACT_STORE_DIR, when hosts share one: kept bodies go there. */
    artifactStoreDir: string | undefined;
    clock: Clock;
    log: Logger;
  },
): { runner: AsyncOperationRunner } {
  let key: Promise<CryptoKey> | undefined;
  const hostDir = join(opts.dataDir, "hosts", opts.hostId);
  const spoolDir = join(hostDir, "upstream-spool");
  const log = opts.log.child({ component: "upstreams" });
  const directory = createUpstreamDirectory({ db: opts.db, key: () => (key ??= importSealKey(u.key)), clock: opts.clock, cacheMs: u.config.cacheMs });
  const bodies = createBodyKeeper({
    store: opts.artifactStoreDir ? createDirArtifactStore({ root: opts.artifactStoreDir, log: opts.log }) : undefined,
    dataDir: opts.dataDir,
    scratchDir: spoolDir,
  });
  const store = createDbAsyncOperationStore(opts.db);
  const runner = new AsyncOperationRunner(
    {
      store,
      call: createAsyncCall({ config: u.config, directory, bodies, destination: u.destination, spoolDir, clock: opts.clock }),
      clock: opts.clock,
      log,
      config: {
        pollIntervalMs: asyncPollMs,
        leaseMs: asyncLeaseMs,
        concurrency: u.config.async.concurrency,
        maxAttempts: u.config.async.maxAttempts,
        backoff: { backoffBaseMs: 1000, backoffMaxMs: 300_000 },
      },
    },
    `${opts.hostId}:${randomBytes(4).toString("hex")}`,
  );
  u.slot.bind(
    new UpstreamCalls({
      config: u.config,
      owner: opts.owner,
      directory,
      journal: createOperationJournal(opts.db),
      bodies,
      async: asyncCalls(store, () => runner.kick()),
      spoolDir,
      hostId: opts.hostId,
      clock: opts.clock,
      log,
    }),
  );
  return { runner };
}

/** The proxy's view of the async queue: a queued call kicks this host's runner (another host's finds it at its next poll). */
function asyncCalls(store: AsyncOperationStore, kick: () => void): AsyncCalls {
  const view = (row: OperationRow): QueuedOperation => ({
    id: row.id,
    state: row.state,
    requestHash: row.requestHash,
    status: row.status,
    error: row.error,
  });
  return {
    async enqueue(call) {
      const { queued, row } = await store.enqueue(call);
      if (queued) kick();
      return { queued, operation: view(row) };
    },
    async read(agentId, id) {
      const found = await store.read(agentId, id);
      if (!found) return undefined;
      return { ...view(found.row), ...(found.outcome ? { outcome: { headers: found.outcome.headers, body: found.outcome.body } } : {}) };
    },
  };
}
