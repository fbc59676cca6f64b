// What authentication leaves on a request's context for the routes behind it.
import type { Context, MiddlewareHandler } from "hono";
import { AppError } from "../lib/errors.ts";

/**
 * `operator` is the platform operator's: it drives tenants and rate cards (`/v1/tenants…`), whatever tenant its token
 * names, and is never needed (nor enough) for a tenant's own routes.
 */
export type Scope = "agents:invoke" | "agents:admin" | "usage:read" | "operator";
export const allScopes: readonly Scope[] = ["agents:invoke", "agents:admin", "usage:read", "operator"];

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

/** The verified caller of a route that needs `scope`; 401 without a token, 403 without the scope. */
/** Route middleware: the caller must hold `scope`, checked before the body is read or validated (401/403 come first). */
export function scopeGate(scope: Scope): MiddlewareHandler<GatewayEnv> {
  return async (c, next) => {
    requireScope(c, scope);
    await next();
  };
}

export function requireScope(c: Context<GatewayEnv>, scope: Scope): Caller {
  const caller = c.get("caller");
  if (!caller) throw new AppError("unauthorized", "missing or invalid bearer token");
  if (!caller.scopes.has(scope)) throw new AppError("forbidden", `token lacks the ${scope} scope`);
  return caller;
}
