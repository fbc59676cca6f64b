// The tenant gate reads what each route declares: the operator's routes, and only they, let an operator token's tenant go unchecked.
import { describe, expect, it } from "vitest";
import { apiApp } from "../../compose/api-document.ts";
import type { Caller } from "../../contracts/caller.ts";
import { skipsTenantCheck } from "../../gateway/tenants/gate.ts";

const operator: Caller = { tenantId: "ten_operator", subject: "op", scopes: new Set(["operator", "usage:read"]) };
const tenant: Caller = { tenantId: "ten_a", subject: "u", scopes: new Set(["agents:admin", "usage:read"]) };

/** The rule as gateway/tenants/gate.ts wrote it before the routes declared it: eight path strings. */
const listedBefore = (path: string) =>
  path === "/v1/tenants" ||
  path.startsWith("/v1/tenants/") ||
  path === "/v1/rate-cards" ||
  path.startsWith("/v1/rate-cards/") ||
  path === "/v1/audit/verify" ||
  path === "/v1/templates" ||
  path === "/v1/hosts" ||
  path.startsWith("/v1/hosts/");

describe("the tenant gate over the routes' declarations", () => {
  it("exempts an operator token on exactly the routes the path list named, and no other token anywhere", () => {
    const routes = apiApp().routes.filter((r) => r.method !== "ALL" && r.path !== "/*");
    // All handlers of one method and path together, as a request to it matches them.
    const byRoute = new Map<string, { handler: unknown }[]>();
    for (const r of routes) {
      const key = `${r.method} ${r.path}`;
      byRoute.set(key, [...(byRoute.get(key) ?? []), r]);
    }
    expect(byRoute.size).toBeGreaterThan(50);
    const exempt: string[] = [];
    for (const [key, handlers] of byRoute) {
      const path = key.slice(key.indexOf(" ") + 1).replace(/:[A-Za-z]+/g, "x");
      expect([key, skipsTenantCheck(operator, handlers)]).toEqual([key, listedBefore(path)]);
      expect([key, skipsTenantCheck(tenant, handlers)]).toEqual([key, false]);
      if (skipsTenantCheck(operator, handlers)) exempt.push(key);
    }
    expect(exempt.length).toBeGreaterThanOrEqual(15);
  });
});
