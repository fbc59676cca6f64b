// A host's upstream path put together: the owner of each VM from the host, the tenant's upstreams and the operation records from Postgres, kept bodies in the artifact store (or the data directory), bound into the proxy's slot.
import { join } from "node:path";
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import { importSealKey } from "../../lib/seal.ts";
import type { Db } from "../../schema/db.ts";
import { createDirArtifactStore } from "../artifacts/dir-store.ts";
import type { UpstreamConfig } from "../egress/config.ts";
import { UpstreamCalls, type UpstreamSlot, type VmOwner } from "../egress/upstreams.ts";
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
}

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
): void {
  let key: Promise<CryptoKey> | undefined;
  const hostDir = join(opts.dataDir, "hosts", opts.hostId);
  u.slot.bind(
    new UpstreamCalls({
      config: u.config,
      owner: opts.owner,
      directory: createUpstreamDirectory({ db: opts.db, key: () => (key ??= importSealKey(u.key)), clock: opts.clock, cacheMs: u.config.cacheMs }),
      journal: createOperationJournal(opts.db),
      bodies: createBodyKeeper({
        store: opts.artifactStoreDir ? createDirArtifactStore({ root: opts.artifactStoreDir, log: opts.log }) : undefined,
        dataDir: opts.dataDir,
        scratchDir: join(hostDir, "upstream-spool"),
      }),
      spoolDir: join(hostDir, "upstream-spool"),
      hostId: opts.hostId,
      clock: opts.clock,
      log: opts.log.child({ component: "upstreams" }),
    }),
  );
}
