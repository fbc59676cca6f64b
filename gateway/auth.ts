// Bearer-token verification with jose: algorithm allowlist, exp/nbf/iss/aud, tenant and scopes; results cached per token.
import { createLocalJWKSet, createRemoteJWKSet, errors, jwtVerify, type JSONWebKeySet, type JWTVerifyGetKey } from "jose";
import { AppError } from "../lib/errors.ts";
import { allScopes, type Caller, type Scope } from "../contracts/caller.ts";

export interface Authenticator {
  /** The caller a bearer token speaks for; throws `unauthorized` with the reason otherwise. */
  verify(token: string): Promise<Caller>;
  /** A token `verify` already accepted and that has not expired, without waiting: its caller and expiry (ms since the epoch). */
  peek?(token: string): { caller: Caller; until: number } | undefined;
}

export interface JwtAuthOptions {
  /** Keys: a JWKS URL (fetched and cached by jose) or a JWKS document. */
  keys: { jwksUrl: string } | { jwks: JSONWebKeySet };
  issuer: string;
  audience: string;
  algorithms: string[];
  /** Seconds of clock skew tolerated on exp/nbf. */
  clockToleranceS?: number;
  /** Verified tokens kept in memory (by token string) until they expire. */
  cacheSize?: number;
  now?: () => number;
}

/** Claims a token carries besides the registered ones: `tenant` and a space-separated `scope`. */
export interface TenantClaims {
  tenant: string;
  scope: string;
}

export function createJwtAuthenticator(opts: JwtAuthOptions): Authenticator {
  const getKey: JWTVerifyGetKey = "jwksUrl" in opts.keys ? createRemoteJWKSet(new URL(opts.keys.jwksUrl)) : createLocalJWKSet(opts.keys.jwks);
  const cache = new Map<string, { caller: Caller; expMs: number }>();
  const cacheSize = opts.cacheSize ?? 10_000;
  const now = opts.now ?? Date.now;

  return {
    async verify(token) {
      const hit = cache.get(token);
      if (hit) {
        if (hit.expMs > now()) return hit.caller;
        cache.delete(token);
      }
      const { caller, expMs } = await verifyUncached(token);
      if (cache.size >= cacheSize) cache.delete(cache.keys().next().value!);
      cache.set(token, { caller, expMs });
      return caller;
    },
    peek(token) {
      const hit = cache.get(token);
      return hit && hit.expMs > now() ? { caller: hit.caller, until: hit.expMs } : undefined;
    },
  };

  async function verifyUncached(token: string): Promise<{ caller: Caller; expMs: number }> {
    try {
      const { payload } = await jwtVerify(token, getKey, {
        issuer: opts.issuer,
        audience: opts.audience,
        algorithms: opts.algorithms,
        clockTolerance: opts.clockToleranceS ?? 30,
        requiredClaims: ["exp", "sub", "tenant"],
        currentDate: new Date(now()),
      });
      const tenant = payload.tenant;
      if (typeof tenant !== "string" || tenant === "") throw new AppError("unauthorized", "token has no tenant claim");
      const scopes = new Set<Scope>();
      const raw = typeof payload.scope === "string" ? payload.scope.split(" ") : [];
      for (const s of raw) if ((allScopes as readonly string[]).includes(s)) scopes.add(s as Scope);
      return { caller: { tenantId: tenant, subject: String(payload.sub), scopes }, expMs: (payload.exp ?? 0) * 1000 };
    } catch (err) {
      throw tokenError(err);
    }
  }
}

function tokenError(err: unknown): AppError {
  if (err instanceof AppError) return err;
  if (err instanceof errors.JWTExpired) return new AppError("unauthorized", "token expired");
  if (err instanceof errors.JWTClaimValidationFailed) {
    if (err.claim === "nbf") return new AppError("unauthorized", "token not yet valid");
    return new AppError("unauthorized", `token rejected: ${err.claim} ${err.reason === "missing" ? "missing" : "mismatch"}`);
  }
  if (err instanceof errors.JOSEAlgNotAllowed) return new AppError("unauthorized", "token algorithm not allowed");
  if (err instanceof errors.JWSSignatureVerificationFailed) return new AppError("unauthorized", "token signature invalid");
  if (err instanceof errors.JWKSNoMatchingKey) return new AppError("unauthorized", "token signed by an unknown key");
  if (err instanceof errors.JWTInvalid || err instanceof errors.JWSInvalid) return new AppError("unauthorized", "token malformed");
  return new AppError("unauthorized", "token invalid");
}

/** `Authorization: Bearer <token>` → token; undefined when absent; throws on another scheme. */
export function bearerToken(header: string | undefined | null): string | undefined {
  if (!header) return undefined;
  const m = /^Bearer\s+([A-Za-z0-9\-_.~+/]+=*)\s*$/i.exec(header);
  if (!m) throw new AppError("unauthorized", "Authorization header must be `Bearer <token>`");
  return m[1];
}
