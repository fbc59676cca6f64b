// Short-lived HS256 tokens between components: gateway → host calls, host → billing shipments.
import { SignJWT, jwtVerify, errors as joseErrors } from "jose";
import { AppError } from "./errors.ts";
import type { Logger } from "./log.ts";

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

/** Seconds a component token's times may be off before it is refused (both ways: expiry, and issue time in the future). */
export const componentClockToleranceS = 5;

export interface VerifyOptions {
  /** This host's clock, ms since the epoch (tests pass a fixed one); default: Date.now. */
  now?: () => number;
  /** Told (warn) of every token refused for its times, with the skew it shows: a clock off is found here first. */
  log?: Logger;
}

/**
 * Verifies a component token for `aud`; answers its claims (extra ones included) or throws `unauthorized` with the
 * reason. A token refused for its times says by how much, and which clock may be off: signer and verifier disagree
 * when the token is fresh (it is sent within a second of its signing), so its age here is about their skew.
 */
export async function verifyComponentToken(
  key: Uint8Array,
  token: string | undefined,
  aud: ComponentAudience,
  opts: VerifyOptions = {},
): Promise<ComponentClaims & { payload: Record<string, unknown> }> {
  if (!token) throw new AppError("unauthorized", "missing component token");
  const nowMs = (opts.now ?? Date.now)();
  const nowS = nowMs / 1000;
  let payload: Record<string, unknown>;
  try {
    ({ payload } = await jwtVerify(token, key, {
      algorithms: ["HS256"],
      issuer,
      audience: aud,
      clockTolerance: componentClockToleranceS,
      currentDate: new Date(nowMs),
    }));
  } catch (err) {
    if (err instanceof joseErrors.JWTExpired) {
      const { exp, iat } = err.payload;
      const agoS = typeof exp === "number" ? Math.round(nowS - exp) : undefined;
      const skewS = typeof iat === "number" ? Math.round(nowS - iat) : agoS;
      throw refusedForTime(
        `component token expired${agoS !== undefined ? ` ${agoS} s ago` : ""}${skewS !== undefined ? ` (this host's clock may be ahead of the signer's by about ${skewS} s)` : ""}`,
        skewS,
        aud,
        opts.log,
      );
    }
    if (err instanceof joseErrors.JWTClaimValidationFailed && err.claim === "nbf") {
      const { nbf } = err.payload;
      const inS = typeof nbf === "number" ? Math.round(nbf - nowS) : undefined;
      throw refusedForTime(
        `component token not valid yet${inS !== undefined ? ` (for another ${inS} s: this host's clock may be behind the signer's)` : ""}`,
        inS === undefined ? undefined : -inS,
        aud,
        opts.log,
      );
    }
    if (err instanceof joseErrors.JWTClaimValidationFailed) throw new AppError("unauthorized", `component token rejected: ${err.claim} mismatch`);
    throw new AppError("unauthorized", "component token invalid");
  }
  // jose checks `iat` only with a maximum age: a token issued in the future (this host's clock behind) is refused here.
  const { iat } = payload;
  if (typeof iat === "number" && iat > nowS + componentClockToleranceS) {
    const aheadS = Math.round(iat - nowS);
    throw refusedForTime(
      `component token issued ${aheadS} s in the future (this host's clock may be behind the signer's by about ${aheadS} s)`,
      -aheadS,
      aud,
      opts.log,
    );
  }
  return { sub: String(payload.sub), aud, payload };
}

/**
 * The refusal of a token for its times: logged (when a logger is given) with the skew, the host's clock minus the
 * signer's, s. `clock_skew` (503, Retry-After), not `unauthorized`: the caller's credentials are fine, one clock is off,
 * and a caller retries (a gateway elsewhere, once the agent moved; a shipment, once the clock is right).
 */
function refusedForTime(message: string, skewS: number | undefined, aud: ComponentAudience, log: Logger | undefined): AppError {
  log?.warn(message, { aud, ...(skewS !== undefined ? { clockSkewS: skewS } : {}) });
  return new AppError("clock_skew", message, { retryAfterS: 2 });
}
