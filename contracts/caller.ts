// What authentication leaves on a request's context for the routes behind it.
import type { Context, MiddlewareHandler } from "hono";
import { AppError } from "../lib/errors.ts";

/**
 * `operator` is the platform operator's: it drives tenants and rate cards (`/v1/tenants…`), whatever tenant its token
 * names, and is never needed (nor enough) for a tenant's own routes. `agents:exec` runs commands and reads and writes
 * files inside an agent's VM (gateway/exec/): a scope of its own, which `agents:admin` does not imply. Images have
 * theirs too (images/routes.ts): `images:read` lists and reads them and their builds, `images:write` builds, imports
 * and deletes them (a build runs the tenant's `RUN` steps): a pipeline that pushes images needs no power over agents,
 * and `agents:admin` alone builds nothing. `desktop:control` takes over a desktop agent's keyboard and pointer through
 * the viewer (gateway/desktop/vnc.ts; `agents:admin` may too): a support person can be given it without the admin API.
 */
export type Scope = "agents:invoke" | "agents:admin" | "agents:exec" | "desktop:control" | "images:read" | "images:write" | "usage:read" | "operator";
export const allScopes: readonly Scope[] = [
  "agents:invoke",
  "agents:admin",
  "agents:exec",
  "desktop:control",
  "images:read",
  "images:write",
  "usage:read",
  "operator",
];

export interface Caller {
  tenantId: string;
  subject: string;
  scopes: ReadonlySet<Scope>;
}

/** Hono context variables every route can read (set by the gateway's middleware). */
export interface GatewayVariables {
  requestId: string;
  /** Present once a bearer token was verified; routes that need it call `requireScope`. */
  caller: Caller | undefined;
}

export type GatewayEnv = { Variables: GatewayVariables };

/**
 * What a route declares of its callers (on its `scopeGate`): the scope it needs, and whether the tenant gate applies
 * to an operator token there. `"every-caller"` (the default): every verified token's tenant must exist and be active.
 * `"not-operators"`: the operator's routes, where an operator token's tenant claim need not exist (any other token is
 * still checked, so it is refused for its tenant before its scope). The gateway's tenant gate reads this.
 */
export interface RouteAccess {
  scope: Scope;
  tenantGate: "every-caller" | "not-operators";
}

/** A route's scope gate, carrying its declaration. */
export type ScopeGate = MiddlewareHandler<GatewayEnv> & { readonly access: RouteAccess };

/** Route middleware: the caller must hold `scope`, checked before the body is read or validated (401/403 come first). */
export function scopeGate(scope: Scope, opts: { tenantGate?: RouteAccess["tenantGate"] } = {}): ScopeGate {
  const gate: MiddlewareHandler<GatewayEnv> = async (c, next) => {
    requireScope(c, scope);
    await next();
  };
  return Object.assign(gate, { access: { scope, tenantGate: opts.tenantGate ?? "every-caller" } satisfies RouteAccess });
}

/** The declaration a route handler carries, if it is a scope gate. */
export function routeAccessOf(handler: unknown): RouteAccess | undefined {
  return typeof handler === "function" && "access" in handler ? (handler as ScopeGate).access : undefined;
}

/** The verified caller of a route that needs `scope`; 401 without a token, 403 without the scope. */
export function requireScope(c: Context<GatewayEnv>, scope: Scope): Caller {
  const caller = c.get("caller");
  if (!caller) throw new AppError("unauthorized", "missing or invalid bearer token");
  if (!caller.scopes.has(scope)) throw new AppError("forbidden", `token lacks the ${scope} scope`);
  return caller;
}
