// The gateway core over a real database and a given fleet, authenticating the dev signing key's ES256 tokens: what
// route tests (exec, terminal) build their app from.
import type { JWK } from "jose";
import { fromPrivateJwk } from "../../compose/dev-keys.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { AgentRepo } from "../../gateway/agents/repo.ts";
import { createGateway } from "../../gateway/app.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import { silentLogger } from "../../lib/log.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import type { Db } from "../../schema/db.ts";

export function testGateway(opts: { db: Db; agents: AgentRepo; fleet: Fleet; privateJwk: JWK }): ReturnType<typeof createGateway> {
  return createGateway({
    agents: opts.agents,
    fleet: opts.fleet,
    audit: createDbAuditLog(opts.db),
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(opts.privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    config: {
      domain: undefined,
      maxBodyBytes: 1000,
      maxApiBodyBytes: 100_000,
      images: ["demo"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
    },
  });
}
