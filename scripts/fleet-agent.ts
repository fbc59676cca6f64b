// `npm run fleet-agent`: one host's daemon; configuration from the environment, parsed once here (compose/fleet-agent.ts: fleetAgentDaemonEnv), stopped by SIGINT/SIGTERM.
import { parseEnv } from "../lib/env.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { selectDriver } from "../fleet-agent/drivers/select.ts";
import { daemonConfigOf, fleetAgentDaemonEnv, startFleetAgent } from "../compose/fleet-agent.ts";

try {
  const settings = parseEnv(fleetAgentDaemonEnv, process.env);
  const log = createLogger({ level: settings.LOG_LEVEL });
  const cfg = daemonConfigOf(settings);
  const { driver, notice, upstreams, exchanges } = await selectDriver(cfg.fleet.driver, { dataDir: cfg.dataDir, log, settings });
  if (notice) console.log(notice);
  const daemon = await startFleetAgent(cfg, { log, driver, exchanges, ...(upstreams ? { upstreams } : {}) });
  console.log(`fleet-agent ${daemon.hostId} serving gateways at ${daemon.url}`);
  stopOnSignals(
    () => daemon.stop(),
    log,
    (signal) => log.info(`${signal}: stopping (draining calls, hibernating agents)`),
  );
} catch (err) {
  console.error(err instanceof Error ? err.message : String(err));
  process.exit(1);
}
