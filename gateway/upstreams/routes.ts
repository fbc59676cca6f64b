// Upstreams API (scope agents:admin, the caller's tenant): create, list, get, change and delete a tenant's named outbound endpoints; header values go in and never come out.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { apiRouter, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf } from "../../lib/api.ts";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { upstreamEnvName, upstreamNamePattern, upstreamsGuestUrl } from "../../lib/upstreams.ts";
import { maxUpstreamBodyBytes, NewUpstream, UpstreamListQuery, UpstreamListSchema, UpstreamParams, UpstreamPatch, UpstreamSchema } from "./api-schemas.ts";
import type { UpstreamActor, UpstreamRow, UpstreamStore } from "./store.ts";

export interface UpstreamRouteDeps {
  /** None: this gateway has no upstream key (UPSTREAM_KEY_FILE / the Worker's UPSTREAM_KEY): every route answers 501. */
  store: UpstreamStore | undefined;
  clock: Clock;
}

const tags = ["upstreams"];
const admin = scopeGate("agents:admin");
const body = jsonBody(() => maxUpstreamBodyBytes);

const createUpstreamRoute = createRoute({
  method: "post",
  path: "/v1/upstreams",
  operationId: "createUpstream",
  summary: "Name an outbound endpoint the tenant's agents call through their host (`/u/<name>/…`), with secret headers the agents never see",
  tags,
  middleware: [admin, body],
  request: jsonRequest(NewUpstream),
  responses: { 201: json(UpstreamSchema, "The upstream (header names only)"), ...errors(400, 409, 413, 501) },
});

const listUpstreamsRoute = createRoute({
  method: "get",
  path: "/v1/upstreams",
  operationId: "listUpstreams",
  summary: "The tenant's upstreams by name (header names only)",
  tags,
  middleware: [admin],
  request: { query: UpstreamListQuery },
  responses: { 200: json(UpstreamListSchema, "A page of upstreams"), ...errors(400, 501) },
});

const getUpstreamRoute = createRoute({
  method: "get",
  path: "/v1/upstreams/{name}",
  operationId: "getUpstream",
  summary: "One upstream (header names only)",
  tags,
  middleware: [admin],
  request: { params: UpstreamParams },
  responses: { 200: json(UpstreamSchema, "The upstream"), ...errors(404, 501) },
});

const patchUpstreamRoute = createRoute({
  method: "patch",
  path: "/v1/upstreams/{name}",
  operationId: "updateUpstream",
  summary: "Change an upstream's base URL and/or replace its whole set of secret headers (hosts see it within their cache's few seconds)",
  tags,
  middleware: [admin, body],
  request: { params: UpstreamParams, ...jsonRequest(UpstreamPatch) },
  responses: { 200: json(UpstreamSchema, "The upstream"), ...errors(400, 404, 413, 501) },
});

const deleteUpstreamRoute = createRoute({
  method: "delete",
  path: "/v1/upstreams/{name}",
  operationId: "deleteUpstream",
  summary: "Delete an upstream: agents' calls to it answer 404 upstream_not_found (its operations are kept)",
  tags,
  middleware: [admin],
  request: { params: UpstreamParams },
  responses: { 204: { description: "Deleted" }, ...errors(404, 501) },
});

export function upstreamRoutes(deps: UpstreamRouteDeps): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { clock } = deps;
  const by = (c: Context<GatewayEnv>, caller: Caller): UpstreamActor => ({ actor: caller.subject, requestId: c.get("requestId") ?? null });

  function store(): UpstreamStore {
    if (!deps.store) throw new AppError("upstreams_unsupported", "this gateway has no upstream key (UPSTREAM_KEY_FILE): it keeps no upstreams");
    return deps.store;
  }

  async function ownUpstream(caller: Caller, name: string): Promise<UpstreamRow> {
    const row = upstreamNamePattern.test(name) ? await store().get(caller.tenantId, name) : undefined;
    if (!row) throw new AppError("upstream_not_found", `upstream "${name.slice(0, 64)}" not found`);
    return row;
  }

  r.openapi(createUpstreamRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const input = c.req.valid("json");
    const row = await store().create(caller.tenantId, input, by(c, caller), new Date(clock.now()));
    if (!row) throw new AppError("conflict", `the tenant already has an upstream named "${input.name}"`);
    return c.json(upstreamView(row), 201);
  });

  r.openapi(listUpstreamsRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const { limit, cursor } = c.req.valid("query");
    const afterName = cursor === undefined ? undefined : (decodeCursor(cursor, ["string"])[0] as string);
    const rows = await store().list(caller.tenantId, { limit: limit + 1, afterName });
    const page = pageOf(rows, limit, (u) => [u.name]);
    return c.json({ upstreams: page.items.map(upstreamView), nextCursor: page.nextCursor }, 200);
  });

  r.openapi(getUpstreamRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    return c.json(upstreamView(await ownUpstream(caller, c.req.valid("param").name)), 200);
  });

  r.openapi(patchUpstreamRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownUpstream(caller, c.req.valid("param").name);
    const updated = await store().update(row, c.req.valid("json"), by(c, caller), new Date(clock.now()));
    if (!updated) throw new AppError("upstream_not_found", `upstream "${row.name}" not found`);
    return c.json(upstreamView(updated), 200);
  });

  r.openapi(deleteUpstreamRoute, async (c) => {
    const caller = requireScope(c, "agents:admin");
    const row = await ownUpstream(caller, c.req.valid("param").name);
    if (!(await store().delete(row, by(c, caller), new Date(clock.now())))) throw new AppError("upstream_not_found", `upstream "${row.name}" not found`);
    return c.body(null, 204);
  });

  return r;
}

/** An upstream as the API shows it: never `headers_sealed`, never a value. */
export function upstreamView(r: UpstreamRow) {
  return {
    id: r.id,
    name: r.name,
    baseUrl: r.baseUrl,
    headerNames: r.headerNames,
    url: `${upstreamsGuestUrl}/${r.name}`,
    env: upstreamEnvName(r.name),
    createdAt: r.createdAt.toISOString(),
    updatedAt: r.updatedAt.toISOString(),
  };
}
