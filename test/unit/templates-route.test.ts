// GET /v1/templates through app.request(): the fleet's list as is, none from a fleet without templates, the operator scope only; the host call it makes.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exportJWK, generateKeyPair, type JWK } from "jose";
import { openDatabase, type Database } from "../../schema/db.ts";
import { silentLogger } from "../../lib/log.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import type { Fleet, TemplateView } from "../../contracts/fleet.ts";
import { hostCallMethod, signHostCall, verifyHostCall } from "../../contracts/host-protocol.ts";
import { componentKey } from "../../lib/host-token.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";

let database: Database;
let privateJwk: JWK;

const view: TemplateView = { hostId: "hst_1", key: "0a1b2c3d4e5f6071", image: "demo", memMiB: 256, vcpus: 1, allowEgress: false, state: "building" };

beforeAll(async () => {
  database = await openDatabase({ pgliteMemory: true });
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  await createAgentRepo(database.db).ensureTenant("ten_a", "A");
});
afterAll(async () => database?.close());

function app(fleet: Fleet) {
  return createGateway({
    agents: createAgentRepo(database.db),
    fleet,
    audit: createDbAuditLog(database.db),
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    config: {
      domain: "agents.test",
      maxBodyBytes: 1000,
      maxApiBodyBytes: 10_000,
      images: ["demo"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000 },
    },
  });
}

const bearer = async (scopes: ("operator" | "agents:admin" | "agents:invoke" | "usage:read")[]) => ({
  authorization: `Bearer ${await mintToken(privateJwk, { tenant: "ten_a", scopes })}`,
});

describe("GET /v1/templates", () => {
  it("answers the fleet's templates to an operator token", async () => {
    let asked = 0;
    const res = await app(fakeFleet({ templates: async () => (asked++, [view]) })).request("/v1/templates", { headers: await bearer(["operator"]) });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ templates: [view] });
    expect(asked).toBe(1);
  });

  it("answers none when the fleet has no templates method", async () => {
    const res = await app(fakeFleet()).request("/v1/templates", { headers: await bearer(["operator"]) });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ templates: [] });
  });

  it("refuses a token without the operator scope (403) before asking the fleet", async () => {
    let asked = 0;
    const res = await app(fakeFleet({ templates: async () => (asked++, [view]) })).request("/v1/templates", {
      headers: await bearer(["agents:admin", "agents:invoke", "usage:read"]),
    });
    expect(res.status).toBe(403);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("forbidden");
    expect(asked).toBe(0);
  });
});

describe("the templates host call", () => {
  it("is a GET whose token carries the op alone and verifies for its host", async () => {
    const key = componentKey("x".repeat(32));
    expect(hostCallMethod({ op: "templates" })).toBe("GET");
    expect(await verifyHostCall(key, "hst_1", await signHostCall(key, "hst_1", { op: "templates" }))).toEqual({ op: "templates" });
  });
});
