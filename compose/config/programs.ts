// The programs and their configuration schemas, and every fragment they are composed of: what `npm run docs` documents and the tests check.
import type { z } from "zod";
import { upstreamEnv, shutdownEnv } from "../../lib/shared-env.ts";
import { databaseEnv } from "../../schema/postgres.ts";
import { gatewayEnv, proxyLimitsEnv } from "../../gateway/config.ts";
import { webhookEnv } from "../../gateway/webhooks/config.ts";
import { fleetAgentEnv } from "../../fleet-agent/config.ts";
import { artifactStoreEnv } from "../../fleet-agent/artifacts/config.ts";
import { qemuEnv } from "../../fleet-agent/drivers/qemu/config.ts";
import { firecrackerEnv } from "../../fleet-agent/drivers/firecracker/config.ts";
import { egressEnv } from "../../fleet-agent/egress/config.ts";
import { guestKernelEnv } from "../../fleet-agent/guest/kernel-env.ts";
import { allInOneEnv } from "../all-in-one.ts";
import { standaloneGatewayEnv } from "../standalone-gateway.ts";
import { daemonEnv, fleetAgentDaemonEnv } from "../fleet-agent.ts";
import { nodeGatewayEnv } from "../node-gateway.ts";
import { clientLimitsEnv } from "../client-limits.ts";
import { metricsEnv } from "../metrics.ts";
import { workerEnv, workerOnlyEnv } from "../worker-env.ts";
import { clockSkewEnv, componentEnv, logLevelEnv, placementEnv, processEnv, remoteHostsEnv, upstreamKeyEnv } from "./shared.ts";

export interface Program {
  /** The heading: how it is started. */
  title: string;
  /** One paragraph on where its variables come from. */
  about: string;
  schema: z.ZodObject;
}

export const programs: Program[] = [
  {
    title: "`npm start`: the whole system in one process",
    about:
      "Gateway, one host (fleet-agent) and billing in one process, on the embedded database unless `DATABASE_URL` is set (`scripts/start.ts`, `compose/all-in-one.ts`).",
    schema: allInOneEnv,
  },
  {
    title: "`npm run gateway`: a standalone Node gateway",
    about:
      "A gateway over the shared Postgres in front of fleet-agents on other processes or machines (`scripts/gateway.ts`, `compose/standalone-gateway.ts`).",
    schema: standaloneGatewayEnv,
  },
  {
    title: "`npm run fleet-agent`: one host's daemon",
    about: "Registers and heartbeats in the shared Postgres and serves the ingress gateways call (`scripts/fleet-agent.ts`, `compose/fleet-agent.ts`).",
    schema: fleetAgentDaemonEnv,
  },
  {
    title: "The Cloudflare Worker",
    about:
      "Bindings, `[vars]` in `wrangler.toml` and secrets (`wrangler secret put`); values typed as numbers or booleans in `wrangler.toml` are read as their text. A missing or malformed one does not crash the Worker: every request answers `500` naming all of them (`compose/worker-env.ts`). One of `JWKS_URL` and `JWKS_JSON` is required.",
    schema: workerEnv,
  },
];

/** Every fragment by the file that defines it: a variable is defined in exactly one (the test checks it). */
export const fragments: Record<string, z.ZodObject> = {
  "lib/shared-env.ts upstreamEnv": upstreamEnv,
  "lib/shared-env.ts shutdownEnv": shutdownEnv,
  "schema/postgres.ts databaseEnv": databaseEnv,
  "gateway/config.ts gatewayEnv": gatewayEnv,
  "gateway/config.ts proxyLimitsEnv": proxyLimitsEnv,
  "gateway/webhooks/config.ts webhookEnv": webhookEnv,
  "fleet-agent/config.ts fleetAgentEnv": fleetAgentEnv,
  "fleet-agent/artifacts/config.ts artifactStoreEnv": artifactStoreEnv,
  "fleet-agent/drivers/qemu/config.ts qemuEnv": qemuEnv,
  "fleet-agent/drivers/firecracker/config.ts firecrackerEnv": firecrackerEnv,
  "fleet-agent/egress/config.ts egressEnv": egressEnv,
  "fleet-agent/guest/kernel-env.ts guestKernelEnv": guestKernelEnv,
  "compose/config/shared.ts logLevelEnv": logLevelEnv,
  "compose/config/shared.ts processEnv": processEnv,
  "compose/config/shared.ts componentEnv": componentEnv,
  "compose/config/shared.ts placementEnv": placementEnv,
  "compose/config/shared.ts clockSkewEnv": clockSkewEnv,
  "compose/config/shared.ts remoteHostsEnv": remoteHostsEnv,
  "compose/config/shared.ts upstreamKeyEnv": upstreamKeyEnv,
  "compose/node-gateway.ts nodeGatewayEnv": nodeGatewayEnv,
  "compose/client-limits.ts clientLimitsEnv": clientLimitsEnv,
  "compose/metrics.ts metricsEnv": metricsEnv,
  "compose/fleet-agent.ts daemonEnv": daemonEnv,
  "compose/worker-env.ts workerOnlyEnv": workerOnlyEnv,
};
