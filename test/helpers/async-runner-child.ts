// A host's async-call runner alone in a process (test/integration/upstream-async.test.ts kills it with SIGKILL mid-call): env DB_URL, DATA_DIR, EGRESS_ALLOW, KEY_HEX.
import { systemClock } from "../../lib/clock.ts";
import { createLogger } from "../../lib/log.ts";
import { openDatabase } from "../../schema/db.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import { UpstreamSlot } from "../../fleet-agent/egress/upstreams.ts";
import { serveUpstreams } from "../../fleet-agent/upstreams/serve.ts";

const env = process.env;
const database = await openDatabase({ url: env.DB_URL!, maxConnections: 4 }, { migrate: false });
const config = parseEgressConfig({ EGRESS_ALLOW: env.EGRESS_ALLOW ?? "" });
const slot = new UpstreamSlot();
const proxy = new EgressProxy(config, { upstreams: slot });
const { runner } = serveUpstreams(
  { slot, config: config.upstreams, key: Buffer.from(env.KEY_HEX!, "hex"), destination: (h, p) => proxy.destination(h, p) },
  {
    db: database.db,
    owner: () => undefined,
    hostId: "host_child",
    dataDir: env.DATA_DIR!,
    artifactStoreDir: env.ARTIFACTS,
    clock: systemClock,
    log: createLogger({ level: "warn" }),
  },
);
runner.start();
// The clock's timers do not hold the process (lib/clock.ts): this does, until the test kills it.
setInterval(() => {}, 1 << 30);
console.log("runner ready");
