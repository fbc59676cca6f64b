// Component tokens refused for their times say by how much the clocks disagree, and tell a logger when given one.
import { describe, expect, it } from "vitest";
import { SignJWT } from "jose";
import { componentKey, signComponentToken, verifyComponentToken } from "../../lib/host-token.ts";
import { createLogger } from "../../lib/log.ts";
import { AppError } from "../../lib/errors.ts";

const key = componentKey("test-component-secret-0123456789abcdef");
const aud = "host:h1" as const;
/** The signer's clock when it signed, s: every test reads the verifier's clock relative to it. */
const signedAtS = Date.UTC(2026, 0, 1, 12) / 1000;

/** What signComponentToken makes (iss agentvm, a 60 s lifetime), signed at a fixed time. */
function tokenAt(iatS: number, k = key, extra: { nbfS?: number } = {}): Promise<string> {
  const jwt = new SignJWT({})
    .setProtectedHeader({ alg: "HS256" })
    .setIssuer("agentvm")
    .setSubject("gateway")
    .setAudience(aud)
    .setIssuedAt(iatS)
    .setExpirationTime(iatS + 60);
  if (extra.nbfS !== undefined) jwt.setNotBefore(extra.nbfS);
  return jwt.sign(k);
}
const at = (s: number) => () => s * 1000;

function captured() {
  const lines: Record<string, unknown>[] = [];
  return { lines, log: createLogger({ level: "debug", write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>) }) };
}

/** The refusal of a token: `clock_skew` (503, retried after 2 s) when for its times, `unauthorized` otherwise. */
async function refusal(p: Promise<unknown>, code: "clock_skew" | "unauthorized" = "clock_skew"): Promise<AppError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  expect((err as AppError).code).toBe(code);
  if (code === "clock_skew") expect((err as AppError).retryAfterS).toBe(2);
  return err as AppError;
}

describe("component token skew", () => {
  it("accepts a fresh token, and one within the tolerance either way", async () => {
    const fresh = await signComponentToken(key, { sub: "gateway", aud });
    expect((await verifyComponentToken(key, fresh, aud)).sub).toBe("gateway");
    const token = await tokenAt(signedAtS);
    expect((await verifyComponentToken(key, token, aud, { now: at(signedAtS - 5) })).sub).toBe("gateway");
    expect((await verifyComponentToken(key, token, aud, { now: at(signedAtS + 64) })).sub).toBe("gateway");
  });

  it("an expired token states how long ago and the likely skew (this host ahead), and warns the logger", async () => {
    const token = await tokenAt(signedAtS);
    const { lines, log } = captured();
    const err = await refusal(verifyComponentToken(key, token, aud, { now: at(signedAtS + 612), log }));
    expect(err.message).toBe("component token expired 552 s ago (this host's clock may be ahead of the signer's by about 612 s)");
    expect(lines).toEqual([expect.objectContaining({ level: "warn", msg: err.message, aud, clockSkewS: 612 })]);
    // Just past the lifetime and the tolerance: refused too.
    expect((await refusal(verifyComponentToken(key, token, aud, { now: at(signedAtS + 66) }))).message).toBe(
      "component token expired 6 s ago (this host's clock may be ahead of the signer's by about 66 s)",
    );
  });

  it("a token issued in the future (this host behind) is refused with the skew; jose alone would accept it", async () => {
    const token = await tokenAt(signedAtS);
    const { lines, log } = captured();
    const err = await refusal(verifyComponentToken(key, token, aud, { now: at(signedAtS - 600), log }));
    expect(err.message).toBe("component token issued 600 s in the future (this host's clock may be behind the signer's by about 600 s)");
    expect(lines).toEqual([expect.objectContaining({ level: "warn", msg: err.message, clockSkewS: -600 })]);
    expect((await refusal(verifyComponentToken(key, token, aud, { now: at(signedAtS - 6) }))).message).toMatch(/^component token issued 6 s in the future/);
  });

  it("a token not valid yet (nbf) says so; no logger is fine; a forged token says nothing about times", async () => {
    const early = await tokenAt(signedAtS, key, { nbfS: signedAtS + 30 });
    expect((await refusal(verifyComponentToken(key, early, aud, { now: at(signedAtS) }))).message).toBe(
      "component token not valid yet (for another 30 s: this host's clock may be behind the signer's)",
    );
    const forged = await tokenAt(signedAtS, componentKey("another-component-secret-0123456789abcdef"));
    const { lines, log } = captured();
    expect((await refusal(verifyComponentToken(key, forged, aud, { now: at(signedAtS + 612), log }), "unauthorized")).message).toBe("component token invalid");
    expect(lines).toHaveLength(0);
  });
});
