// `npm start`: the whole system in one process on an embedded database; prints the demo agent's URL and a token.
import { resolve } from "node:path";
import { oneOf, str } from "../lib/env.ts";
import { createLogger } from "../lib/log.ts";
import { stopOnSignals } from "../lib/signals.ts";
import { parseFleetAgentConfig } from "../fleet-agent/config.ts";
import { selectDriver } from "../fleet-agent/drivers/select.ts";
import { parseAllInOneConfig, startAllInOne } from "../compose/all-in-one.ts";
import { ensureDashboard } from "./build-dashboard.ts";

const env = process.env;
const log = createLogger({ level: oneOf(env, "LOG_LEVEL", ["debug", "info", "warn", "error"] as const, "info") });
const dataDir = resolve(str(env, "DATA_DIR", ".data"));
const { driver, images, notice } = await selectDriver(parseFleetAgentConfig(env).driver, { dataDir, log, env });
if (notice) console.log(notice);
await ensureDashboard({ log: (line) => console.log(line) }).catch((err: Error) => console.log(`dashboard not built (${err.message}): /dashboard/ answers 404`));
const system = await startAllInOne(parseAllInOneConfig(env, images), { driver, log });

const agentUrl = `${system.url}/a/${system.demo.agentId}/`;
console.log(`
agentvm is running (driver: ${driver.name}${driver.isolated ? "" : ", NOT isolated"}; data: ${dataDir}; database: ${system.database.kind})

  gateway     ${system.url}
  demo agent  ${agentUrl}
  token       ${system.demo.token}
  operator    ${system.operatorToken}
              (scope operator only: agentvm tenants ls|create|suspend|resume|rm, /v1/tenants)
  metrics     ${system.url}/metrics  (Authorization: Bearer ${system.metricsToken})

Call the demo agent (the first call wakes it):
  curl -H "Authorization: Bearer ${system.demo.token}" ${agentUrl}counter -X POST

Mint other tokens with: npm run token -- --tenant ${system.demo.tenantId} --scopes agents:invoke,agents:admin,usage:read
  (an operator token: npm run token -- --operator; other tenants: agentvm tenants create --id ten_x --name X, then --tenant ten_x)
Stop with Ctrl-C.
`);

stopOnSignals(() => system.stop(), log, (signal) => console.log(`\n${signal}: stopping (draining requests, hibernating agents)…`));
