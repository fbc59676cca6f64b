// A gateway process reduced to webhooks (intake + delivery worker) for crash tests: run it, kill -9 it, start another.
// env: DATABASE_URL, AGENT_URL (where "the agent" listens), WEBHOOK_WORKER=on|off, and the WEBHOOK_* limits.
import { serve } from "@hono/node-server";
import type { AddressInfo } from "node:net";
import { Hono } from "hono";
import { systemClock } from "../../lib/clock.ts";
import { bool, str } from "../../lib/env.ts";
import { newId } from "../../lib/ids.ts";
import { createLogger } from "../../lib/log.ts";
import { openDatabase } from "../../schema/db.ts";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { createWebhookModule, webhookConfigFromEnv } from "../../gateway/webhooks/index.ts";
import { fetchForward } from "./webhook-fixtures.ts";

const env = process.env;
const database = await openDatabase({ url: str(env, "DATABASE_URL", "") }, { migrate: false });
const { routes, worker } = createWebhookModule({
  db: database.db,
  clock: systemClock,
  log: createLogger({ level: "warn" }),
  forward: fetchForward(str(env, "AGENT_URL", "")),
  config: webhookConfigFromEnv(env),
});
const app = new Hono<GatewayEnv>();
app.use(async (c, next) => {
  c.set("requestId", newId("request"));
  c.set("caller", undefined);
  await next();
});
app.route("/", routes);

const server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, (info: AddressInfo) => {
  if (bool(env, "WEBHOOK_WORKER", true)) worker.start();
  process.stdout.write(`LISTENING ${info.port} ${worker.id}\n`);
});
process.on("SIGTERM", () => {
  server.close();
  void worker
    .stop()
    .then(() => database.close())
    .then(() => process.exit(0));
});
