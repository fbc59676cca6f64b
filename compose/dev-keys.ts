// Development signing key (generated at first start into the data directory) and token minting for it.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { calculateJwkThumbprint, exportJWK, generateKeyPair, importJWK, SignJWT, type JSONWebKeySet, type JWK } from "jose";
import type { Scope } from "../contracts/caller.ts";

export interface DevKeys {
  privateJwk: JWK;
  jwks: JSONWebKeySet;
}

export const devIssuer = "agentvm-dev";
export const devAudience = "agentvm";

export function devKeyPath(dataDir: string): string {
  return join(dataDir, "keys", "dev-signing-key.json");
}

/** Loads the dev key from the data directory, creating it (ES256, mode 0600) on first use. */
export async function ensureDevKeys(dataDir: string): Promise<DevKeys> {
  const path = devKeyPath(dataDir);
  if (!existsSync(path)) {
    const { privateKey } = await generateKeyPair("ES256", { extractable: true });
    const jwk = await exportJWK(privateKey);
    jwk.kid = await calculateJwkThumbprint(jwk);
    jwk.alg = "ES256";
    jwk.use = "sig";
    mkdirSync(join(dataDir, "keys"), { recursive: true, mode: 0o700 });
    writeFileSync(path, JSON.stringify(jwk, null, 2), { mode: 0o600 });
  }
  return fromPrivateJwk(JSON.parse(readFileSync(path, "utf8")) as JWK);
}

export function fromPrivateJwk(privateJwk: JWK): DevKeys {
  const { d: _d, ...publicJwk } = privateJwk;
  return { privateJwk, jwks: { keys: [publicJwk] } };
}

export interface TokenRequest {
  tenant: string;
  scopes: readonly Scope[];
  subject?: string;
  ttlS?: number;
  issuer?: string;
  audience?: string;
  /** Seconds from now before which the token is not valid (tests). */
  notBeforeS?: number;
}

export async function mintToken(privateJwk: JWK, t: TokenRequest): Promise<string> {
  const key = await importJWK(privateJwk, "ES256");
  const jwt = new SignJWT({ tenant: t.tenant, scope: t.scopes.join(" ") })
    .setProtectedHeader({ alg: "ES256", kid: privateJwk.kid! })
    .setIssuer(t.issuer ?? devIssuer)
    .setAudience(t.audience ?? devAudience)
    .setSubject(t.subject ?? "dev")
    .setIssuedAt()
    .setExpirationTime(`${t.ttlS ?? 3600}s`);
  if (t.notBeforeS) jwt.setNotBefore(`${t.notBeforeS}s`);
  return jwt.sign(key);
}
