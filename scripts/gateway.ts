// `npm run gateway`: a Node gateway over Postgres in front of fleet-agents elsewhere; configuration from the environment, parsed once here (compose/standalone-gateway.ts: standaloneGatewayEnv).
import { parseEnv } from "../lib/env.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { standaloneGatewayConfigOf, standaloneGatewayEnv, startGateway } from "../compose/standalone-gateway.ts";
import { ensureDashboard } from "./build-dashboard.ts";

try {
  const settings = parseEnv(standaloneGatewayEnv, process.env);
  const log = createLogger({ level: settings.LOG_LEVEL });
  const cfg = standaloneGatewayConfigOf(settings);
  await ensureDashboard({ log: (line) => console.log(line) }).catch((err: Error) =>
    console.log(`dashboard not built (${err.message}): /dashboard/ answers 404`),
  );
  const gateway = await startGateway(cfg, { log });
  console.log(`gateway listening at ${gateway.url} (hosts: fleet-agents registered in the database)`);
  stopOnSignals(() => gateway.stop(), log);
} catch (err) {
  console.error(err instanceof Error ? err.message : String(err));
  process.exit(1);
}
