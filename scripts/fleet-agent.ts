// `npm run fleet-agent`: one host's daemon; configuration from the environment (compose/fleet-agent.ts lists it), stopped by SIGINT/SIGTERM.
import { oneOf } from "../lib/env.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { selectDriver } from "../fleet-agent/drivers/select.ts";
import { parseDaemonConfig, startFleetAgent } from "../compose/fleet-agent.ts";

try {
  const env = process.env;
  const log = createLogger({ level: oneOf(env, "LOG_LEVEL", ["debug", "info", "warn", "error"] as const, "info") });
  const cfg = parseDaemonConfig(env);
  const { driver, notice } = await selectDriver(cfg.fleet.driver, { dataDir: cfg.dataDir, log, env });
  if (notice) console.log(notice);
  const daemon = await startFleetAgent(cfg, { log, driver });
  console.log(`fleet-agent ${daemon.hostId} serving gateways at ${daemon.url}`);
  stopOnSignals(() => daemon.stop(), log, (signal) => log.info(`${signal}: stopping (draining calls, hibernating agents)`));
} catch (err) {
  console.error(err instanceof Error ? err.message : String(err));
  process.exit(1);
}
