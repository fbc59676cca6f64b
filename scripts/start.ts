// `npm start`: the whole system in one process on an embedded database; prints the demo agent's URL and a token.
import { resolve } from "node:path";
import { int, oneOf, optStr, str } from "../lib/env.ts";
import { createLogger } from "../lib/log.ts";
import { parseGatewayConfig } from "../gateway/config.ts";
import { webhookConfigFromEnv } from "../gateway/webhooks/index.ts";
import { parseFleetAgentConfig } from "../fleet-agent/config.ts";
import { selectDriver } from "../fleet-agent/drivers/select.ts";
import { startAllInOne } from "./all-in-one.ts";

const env = process.env;
const log = createLogger({ level: oneOf(env, "LOG_LEVEL", ["debug", "info", "warn", "error"] as const, "info") });
const dataDir = resolve(str(env, "DATA_DIR", ".data"));
const fleet = parseFleetAgentConfig(env);
const { driver, images, notice } = await selectDriver(fleet.driver, { dataDir, log, env });
if (notice) console.log(notice);
const { gateway, auth } = parseGatewayConfig(env, images);

const system = await startAllInOne(
  { port: int(env, "PORT", 8080, { min: 0, max: 65535 }), hostname: str(env, "BIND_ADDRESS", "127.0.0.1"), dataDir, databaseUrl: optStr(env, "DATABASE_URL"), gateway, auth, fleet, webhooks: webhookConfigFromEnv(env) },
  { driver, log },
);

const agentUrl = `${system.url}/a/${system.demo.agentId}/`;
console.log(`
agentvm is running (driver: ${driver.name}${driver.isolated ? "" : ", NOT isolated"}; data: ${dataDir}; database: ${system.database.kind})

  gateway     ${system.url}
  demo agent  ${agentUrl}
  token       ${system.demo.token}

Call the demo agent (the first call wakes it):
  curl -H "Authorization: Bearer ${system.demo.token}" ${agentUrl}counter -X POST

Mint other tokens with: npm run token -- --tenant ${system.demo.tenantId} --scopes agents:invoke,agents:admin,usage:read
Stop with Ctrl-C.
`);

let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    console.log(`\n${signal}: stopping (draining requests, hibernating agents)…`);
    system.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        log.error("shutdown failed", { err });
        process.exit(1);
      },
    );
  });
}
