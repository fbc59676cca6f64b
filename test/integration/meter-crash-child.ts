// Child process for the meter crash test: meters a fixed activity schedule (absolute wall times) and ships over HTTP until killed.
import { Meter } from "../../fleet-agent/meter/meter.ts";
import { HttpSink } from "../../fleet-agent/meter/sinks.ts";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";

export interface CrashChildConfig {
  mode: "run" | "drain";
  dataDir: string;
  hostId: string;
  billingUrl: string;
  secret: string;
  heartbeatMs: number;
  /** Each VM is active during these wall-clock intervals (ms since the epoch). */
  schedule: { vmId: string; runId: string; start: number; end: number }[];
}

const config = JSON.parse(process.env.METER_CHILD_CONFIG ?? "{}") as CrashChildConfig;
const meter = Meter.open({
  hostId: config.hostId,
  dataDir: config.dataDir,
  sink: new HttpSink({ billingUrl: config.billingUrl, hostId: config.hostId, key: componentKey(config.secret), timeoutMs: 5000 }),
  clock: systemClock,
  heartbeatMs: config.heartbeatMs,
  shipper: { lingerMs: 10, minBackoffMs: 20, maxBackoffMs: 200 },
});
meter.start();

if (config.mode === "drain") {
  await meter.stop();
  process.stdout.write("drained\n");
  process.exit(0);
}

const now = Date.now();
for (const s of config.schedule) {
  if (s.end <= now) continue;
  const activate = () =>
    meter.active({
      at: Date.now(),
      mono: performance.now(),
      hostId: config.hostId,
      vmId: s.vmId,
      agentId: `agt_${s.vmId}`,
      tenantId: "ten_crash",
      runId: s.runId,
      vcpus: 1,
      memMiB: 256,
      reason: s.start < now ? "boot" : "request",
    });
  if (s.start <= now) activate();
  else setTimeout(activate, s.start - now);
  setTimeout(() => meter.inactive({ at: Date.now(), mono: performance.now(), vmId: s.vmId, reason: "idle" }), s.end - now);
}
process.stdout.write(`ready ${now}\n`);
setInterval(() => {}, 1 << 30); // stay up until killed
