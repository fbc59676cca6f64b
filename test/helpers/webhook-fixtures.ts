// Shared pieces of the webhook tests: seeded agents, a test auth layer, a real upstream "agent", a fetch-based forward.
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { eq } from "drizzle-orm";
import { Hono } from "hono";
import { agents, tenants } from "../../schema/core.ts";
import type { Db } from "../../schema/db.ts";
import { webhookEndpoints, type WebhookScheme } from "../../schema/webhooks.ts";
import { newId } from "../../lib/ids.ts";
import { allScopes, type Caller, type GatewayEnv, type Scope } from "../../contracts/caller.ts";
import { generateSecret, signGithub, signStandard } from "../../gateway/webhooks/signature.ts";
import type { WebhookDeps } from "../../gateway/webhooks/types.ts";

export async function seedAgent(db: Db, opts: { tenantId?: string; deleted?: boolean } = {}): Promise<{ tenantId: string; agentId: string }> {
  const tenantId = opts.tenantId ?? newId("tenant");
  await db.insert(tenants).values({ id: tenantId, name: tenantId }).onConflictDoNothing();
  const agentId = newId("agent");
  await db.insert(agents).values({ id: agentId, tenantId, name: "a", image: "demo", deletedAt: opts.deleted ? new Date() : null });
  return { tenantId, agentId };
}

export async function deleteAgent(db: Db, agentId: string): Promise<void> {
  await db.update(agents).set({ deletedAt: new Date() }).where(eq(agents.id, agentId));
}

/** Inserts an endpoint directly (what `POST /v1/agents/:id/webhooks` does) and answers its secret. */
export async function seedEndpoint(
  db: Db,
  agent: { tenantId: string; agentId: string },
  opts: { name?: string; scheme?: WebhookScheme; path?: string } = {},
): Promise<{ id: string; name: string; secret: string }> {
  const scheme = opts.scheme ?? "standard";
  const secret = generateSecret(scheme);
  const id = newId("webhook");
  const name = opts.name ?? "events";
  await db.insert(webhookEndpoints).values({ id, tenantId: agent.tenantId, agentId: agent.agentId, name, scheme, path: opts.path ?? "/hooks/in", secret });
  return { id, name, secret };
}

/**
 * Stands in for the gateway's middleware: a request id, and `Bearer <name>` resolved from `callers`
 * (tests of the real JWT path live with the gateway).
 */
export function withTestAuth(routes: Hono<GatewayEnv>, callers: Record<string, Caller>): Hono<GatewayEnv> {
  const app = new Hono<GatewayEnv>();
  app.use(async (c, next) => {
    c.set("requestId", newId("request"));
    const token = /^Bearer (.+)$/.exec(c.req.header("authorization") ?? "")?.[1];
    c.set("caller", token ? callers[token] : undefined);
    await next();
  });
  app.route("/", routes);
  return app;
}

export function caller(tenantId: string, scopes: readonly Scope[] = allScopes, subject = "tester"): Caller {
  return { tenantId, subject, scopes: new Set(scopes) };
}

export async function standardHeaders(secret: string, body: Uint8Array | string, opts: { id?: string; timestampS: number }): Promise<Record<string, string>> {
  const bytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const id = opts.id ?? `msg_${newId("event")}`;
  return {
    "content-type": "application/json",
    "webhook-id": id,
    "webhook-timestamp": String(opts.timestampS),
    "webhook-signature": await signStandard(secret, id, opts.timestampS, bytes),
  };
}

export async function githubHeaders(secret: string, body: Uint8Array | string, deliveryId: string): Promise<Record<string, string>> {
  const bytes = typeof body === "string" ? new TextEncoder().encode(body) : body;
  return {
    "content-type": "application/json",
    "x-github-event": "push",
    "x-github-delivery": deliveryId,
    "x-hub-signature-256": await signGithub(secret, bytes),
  };
}

export interface SeenRequest {
  method: string;
  url: string;
  headers: IncomingMessage["headers"];
  body: Uint8Array;
}

export interface AgentServer {
  url: string;
  seen: SeenRequest[];
  /** Each request answers with the next status in the script (the last one repeats); "hang" never answers. */
  script: (number | "hang" | { status: number; headers?: Record<string, string>; body?: string })[];
  /** Resolves when the agent has received `n` requests. */
  received(n: number, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

/** A real HTTP server standing in for the agent inside its VM. */
export async function startAgentServer(script: AgentServer["script"] = [200]): Promise<AgentServer> {
  const seen: SeenRequest[] = [];
  const waiters: { n: number; resolve: () => void }[] = [];
  const state = { script };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body: new Uint8Array(Buffer.concat(chunks)) });
      for (const w of waiters.filter((w) => seen.length >= w.n)) w.resolve();
      const step = state.script[Math.min(seen.length - 1, state.script.length - 1)] ?? 200;
      if (step === "hang") return;
      const answer = typeof step === "number" ? { status: step } : step;
      res.writeHead(answer.status, { "content-type": "text/plain", ...answer.headers });
      res.end(answer.body ?? `answer ${seen.length}`);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    get script() {
      return state.script;
    },
    set script(s) {
      state.script = s;
    },
    received(n, timeoutMs = 10_000) {
      if (seen.length >= n) return Promise.resolve();
      return new Promise<void>((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`agent saw ${seen.length} requests, waited for ${n}`)), timeoutMs);
        waiters.push({ n, resolve: () => (clearTimeout(t), resolve()) });
      });
    },
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** A `forward` that really calls `baseUrl` over HTTP, as the gateway's proxy would call the woken VM. */
export function fetchForward(baseUrl: string, calls: { agentId: string; requestId: string }[] = []): WebhookDeps["forward"] {
  return async (agentId, req, ctx) => {
    calls.push({ agentId, requestId: ctx.requestId });
    const url = new URL(req.url);
    return fetch(baseUrl + url.pathname + url.search, {
      method: req.method,
      headers: req.headers,
      body: await req.arrayBuffer(),
      signal: req.signal,
    });
  };
}
