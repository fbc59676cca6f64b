// Rate cards: the prices in effect for the caller's tenant, and the operator's versions of a tenant's card and the default card.
import { createRoute } from "@hono/zod-openapi";
import { eq } from "drizzle-orm";
import type { Context } from "hono";
import { requireScope, scopeGate, type GatewayEnv } from "../../contracts/caller.ts";
import { badCursor, decodeCursor, errors, json, jsonBody, jsonRequest, pageOf, type z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { tenants } from "../../schema/core.ts";
import {
  maxRateCardBodyBytes,
  NewRateCardVersion,
  RateCard,
  RateCardsQuery,
  RateCardVersion,
  RateCardVersionPage,
  TenantIdParams,
  TenantRateCards,
} from "../api-schemas.ts";
import {
  addRateCardVersion,
  defaultRateCardAt,
  latestRateInstant,
  listRateCardVersions,
  nextQuarterHour,
  rateCardAt,
  tenantRateCardTimeline,
} from "../rates.ts";
import { rateCardVersionJson } from "../report-views.ts";
import { parseInstant } from "../zones.ts";
import type { BillingRouteContext, BillingRouter } from "./context.ts";
import { rateTags, tags } from "./http.ts";

/** A rate-card versions cursor: the `effectiveFrom` (epoch ms) of the last version shown (unique per card). */
function versionPosition(cursor: string): number {
  const [at] = decodeCursor(cursor, ["number"]) as [number];
  if (!Number.isSafeInteger(at)) throw badCursor();
  return at;
}

const rateCardRoute = createRoute({
  method: "get",
  middleware: [scopeGate("usage:read")],
  path: "/v1/rate-card",
  operationId: "getRateCard",
  summary: "The prices in effect now for the tenant (its card version, or the default card's); see /v1/rate-cards for every version",
  tags,
  responses: { 200: json(RateCard, "The tenant's rate card (or the default one)"), ...errors() },
});

// The operator's routes: an operator token's own tenant need not exist (the gateway's tenant gate reads this).
const operatorOnly = scopeGate("operator", { tenantGate: "not-operators" });
const operatorBody = [operatorOnly, jsonBody(() => maxRateCardBodyBytes)];

const addTenantVersionRoute = createRoute({
  method: "post",
  middleware: operatorBody,
  path: "/v1/tenants/{id}/rate-cards",
  operationId: "addTenantRateCardVersion",
  summary: "Add a version of the tenant's card (operator): it prices the tenant's usage from `effectiveFrom` until its next version",
  tags: rateTags,
  request: { params: TenantIdParams, ...jsonRequest(NewRateCardVersion) },
  responses: {
    201: json(RateCardVersion, "The version written"),
    ...errors(400, 404, 409, 413),
  },
});

const listTenantVersionsRoute = createRoute({
  method: "get",
  middleware: [operatorOnly],
  path: "/v1/tenants/{id}/rate-cards",
  operationId: "listTenantRateCardVersions",
  summary: "The tenant's own card versions, newest first, and the version pricing it now (operator)",
  tags: rateTags,
  request: { params: TenantIdParams, query: RateCardsQuery },
  responses: { 200: json(RateCardVersionPage, "A page of versions"), ...errors(400, 404) },
});

const addDefaultVersionRoute = createRoute({
  method: "post",
  middleware: operatorBody,
  path: "/v1/rate-cards/default",
  operationId: "addDefaultRateCardVersion",
  summary: "Add a version of the default card (operator): it prices every tenant without a version of its own at that time",
  tags: rateTags,
  request: jsonRequest(NewRateCardVersion),
  responses: { 201: json(RateCardVersion, "The version written"), ...errors(400, 409, 413) },
});

const listDefaultVersionsRoute = createRoute({
  method: "get",
  middleware: [operatorOnly],
  path: "/v1/rate-cards/default",
  operationId: "listDefaultRateCardVersions",
  summary: "The default card's versions, newest first, and the one in effect now (operator)",
  tags: rateTags,
  request: { query: RateCardsQuery },
  responses: { 200: json(RateCardVersionPage, "A page of versions"), ...errors(400) },
});

const tenantRateCardsRoute = createRoute({
  method: "get",
  // A tenant's route, but an operator token here is not checked for its tenant either (as ever under /v1/rate-cards).
  middleware: [scopeGate("usage:read", { tenantGate: "not-operators" })],
  path: "/v1/rate-cards",
  operationId: "listRateCards",
  summary: "The card version pricing the caller's tenant now, and every version that priced or will price it (past and scheduled)",
  tags: rateTags,
  request: { query: RateCardsQuery },
  responses: { 200: json(TenantRateCards, "The current version and a page of versions"), ...errors(400) },
});

export function addRateCardRoutes(app: BillingRouter, deps: BillingRouteContext): void {
  const { audit } = deps;

  const assertTenant = async (id: string) => {
    const [row] = await deps.db.select({ id: tenants.id }).from(tenants).where(eq(tenants.id, id));
    if (!row) throw new AppError("not_found", "tenant not found");
  };

  /** Writes a version from a request body; without `effectiveFrom` it starts at the next quarter hour. */
  const addVersion = async (c: Context<GatewayEnv>, tenantId: string | null, body: z.infer<typeof NewRateCardVersion>) => {
    const caller = requireScope(c, "operator");
    const effectiveFrom = body.effectiveFrom !== undefined ? parseInstant(body.effectiveFrom, "UTC", "effectiveFrom") : nextQuarterHour(deps.clock.now());
    const { effectiveFrom: _, ...rates } = body;
    const card = await addRateCardVersion(deps.db, tenantId, rates, effectiveFrom, caller.subject, { audit, requestId: c.get("requestId") ?? null });
    deps.log.info("rate card version", {
      tenantId,
      rateCardId: card.id,
      effectiveFrom: new Date(card.effectiveFrom).toISOString(),
      by: caller.subject,
      requestId: c.get("requestId"),
    });
    return rateCardVersionJson(card);
  };

  app.openapi(addTenantVersionRoute, async (c) => {
    const { id } = c.req.valid("param");
    return c.json(await addVersion(c, id, c.req.valid("json")), 201);
  });

  app.openapi(addDefaultVersionRoute, async (c) => c.json(await addVersion(c, null, c.req.valid("json")), 201));

  const versionPage = async (tenantId: string | null, q: z.infer<typeof RateCardsQuery>) => {
    const rows = await listRateCardVersions(deps.db, tenantId, {
      limit: q.limit + 1,
      ...(q.cursor !== undefined ? { before: versionPosition(q.cursor) } : {}),
    });
    const page = pageOf(rows, q.limit, (v) => [v.effectiveFrom]);
    const now = deps.clock.now();
    const current = tenantId === null ? await defaultRateCardAt(deps.db, now) : await rateCardAt(deps.db, tenantId, now);
    return { tenantId, current: rateCardVersionJson(current), versions: page.items.map(rateCardVersionJson), nextCursor: page.nextCursor };
  };

  app.openapi(listTenantVersionsRoute, async (c) => {
    requireScope(c, "operator");
    const { id } = c.req.valid("param");
    await assertTenant(id);
    return c.json(await versionPage(id, c.req.valid("query")), 200);
  });

  app.openapi(listDefaultVersionsRoute, async (c) => {
    requireScope(c, "operator");
    return c.json(await versionPage(null, c.req.valid("query")), 200);
  });

  app.openapi(tenantRateCardsRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const q = c.req.valid("query");
    const before = q.cursor !== undefined ? versionPosition(q.cursor) : undefined;
    const pieces = (await tenantRateCardTimeline(deps.db, caller.tenantId)).filter((p) => before === undefined || p.from < before);
    const page = pageOf(pieces, q.limit, (p) => [p.from]);
    const now = deps.clock.now();
    const current = await rateCardAt(deps.db, caller.tenantId, now);
    // the last piece runs to the end of what instants can say: no next version is scheduled
    const openEnded = (p: { to: number }) => p.to > latestRateInstant;
    return c.json(
      {
        tenantId: caller.tenantId,
        current: rateCardVersionJson(current),
        versions: page.items.map((p) => ({ ...rateCardVersionJson(p.card), until: openEnded(p) ? null : new Date(p.to).toISOString() })),
        nextCursor: page.nextCursor,
      },
      200,
    );
  });

  app.openapi(rateCardRoute, async (c) => {
    const caller = requireScope(c, "usage:read");
    const card = await rateCardAt(deps.db, caller.tenantId, deps.clock.now());
    return c.json(
      {
        id: card.id,
        tenantId: card.tenantId,
        currency: card.currency,
        vcpuSecondNanocents: card.vcpuSecondNanocents,
        gibSecondNanocents: card.gibSecondNanocents,
        snapshotGibMonthNanocents: card.snapshotGibMonthNanocents,
        dozeVcpuSecondNanocents: card.dozeVcpuSecondNanocents,
        dozeGibSecondNanocents: card.dozeGibSecondNanocents,
        units: {
          vcpuSecondNanocents: "nano-cents per vCPU-second",
          gibSecondNanocents: "nano-cents per GiB-second",
          snapshotGibMonthNanocents: "nano-cents per GiB-month (730 h)",
          dozeVcpuSecondNanocents: "nano-cents per vCPU-second while dozing",
          dozeGibSecondNanocents: "nano-cents per GiB-second while dozing (null: the snapshot rate, per GiB-month of 730 h)",
        },
      },
      200,
    );
  });
}
