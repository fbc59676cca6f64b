// What authentication leaves on a request's context for the routes behind it.

export type Scope = "agents:invoke" | "agents:admin" | "usage:read";
export const allScopes: readonly Scope[] = ["agents:invoke", "agents:admin", "usage:read"];

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
