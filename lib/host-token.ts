// Short-lived HS256 tokens between components: gateway → host calls, host → billing shipments.
import { SignJWT, jwtVerify, errors as joseErrors } from "jose";
import { AppError } from "./errors.ts";

/** Who may be the audience of a component token. */
export type ComponentAudience = `host:${string}` | "billing";

export interface ComponentClaims {
  /** Who signed: `gateway` or a host id. */
  sub: string;
  aud: ComponentAudience;
}

const issuer = "agentvm";

export function componentKey(secret: string): Uint8Array {
  if (secret.length < 32) throw new AppError("bad_request", "configuration: the component secret must be at least 32 characters");
  return new TextEncoder().encode(secret);
}

/** Signs a token for `claims.aud`; `extra` claims (e.g. the one call a gateway allows a host) ride inside it. */
export async function signComponentToken(key: Uint8Array, claims: ComponentClaims, ttlS = 60, extra: Record<string, unknown> = {}): Promise<string> {
  return new SignJWT(extra)
    .setProtectedHeader({ alg: "HS256" })
    .setIssuer(issuer)
    .setSubject(claims.sub)
    .setAudience(claims.aud)
    .setIssuedAt()
    .setExpirationTime(`${ttlS}s`)
    .sign(key);
}

/** Verifies a component token for `aud`; answers its claims (extra ones included) or throws `unauthorized` with the reason. */
export async function verifyComponentToken(key: Uint8Array, token: string | undefined, aud: ComponentAudience): Promise<ComponentClaims & { payload: Record<string, unknown> }> {
  if (!token) throw new AppError("unauthorized", "missing component token");
  try {
    const { payload } = await jwtVerify(token, key, { algorithms: ["HS256"], issuer, audience: aud, clockTolerance: 5 });
    return { sub: String(payload.sub), aud, payload };
  } catch (err) {
    if (err instanceof joseErrors.JWTExpired) throw new AppError("unauthorized", "component token expired");
    if (err instanceof joseErrors.JWTClaimValidationFailed) throw new AppError("unauthorized", `component token rejected: ${err.claim} mismatch`);
    throw new AppError("unauthorized", "component token invalid");
  }
}
