// `agentvm tenants`: the caller's tenant, read from the token's claims; listing tenants needs an operator API not built yet.
import type { Command } from "commander";
import { decodeJwt } from "jose";
import { contextOf } from "./context.ts";
import { usageError } from "./exit.ts";

export interface TokenClaims {
  tenant: string | null;
  subject: string | null;
  scopes: string[];
  issuer: string | null;
  expiresAt: string | null;
}

/** What a token says of its caller, unverified (the gateway verifies it on every call; this only reads it). */
export function tokenClaims(token: string): TokenClaims {
  let claims: Record<string, unknown>;
  try {
    claims = decodeJwt(token);
  } catch {
    throw usageError("the token is not a JWT: its tenant cannot be read");
  }
  const text = (v: unknown) => (typeof v === "string" ? v : null);
  return {
    tenant: text(claims.tenant),
    subject: text(claims.sub),
    scopes: typeof claims.scope === "string" ? claims.scope.split(" ").filter(Boolean) : [],
    issuer: text(claims.iss),
    expiresAt: typeof claims.exp === "number" ? new Date(claims.exp * 1000).toISOString() : null,
  };
}

const notBuilt = "Listing or managing tenants needs an operator API, which is not built yet: a token speaks for one tenant.";

export function tenantsCommand(program: Command): void {
  program
    .command("tenants")
    .description("the tenant your token speaks for (from its claims); listing tenants needs an operator API not built yet")
    .action((_o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      if (!ctx.config.token) throw usageError("no token: pass --token, set AGENTVM_TOKEN, or run `agentvm login`");
      const claims = tokenClaims(ctx.config.token);
      if (ctx.json) return ctx.printJson({ tenants: claims.tenant ? [{ id: claims.tenant }] : [], caller: claims, note: notBuilt });
      ctx.print(`tenant   ${claims.tenant ?? "(none in the token)"}\nsubject  ${claims.subject ?? ""}\nscopes   ${claims.scopes.join(" ")}\nissuer   ${claims.issuer ?? ""}\nexpires  ${claims.expiresAt ?? "never"}\n\n${notBuilt}`);
    });
}
