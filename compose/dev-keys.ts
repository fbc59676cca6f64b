// The signing key of user tokens when no issuer's JWKS is configured (generated at first start: in the data directory, or at SIGNING_KEY_FILE shared by gateways) and token minting for it.
import { randomBytes } from "node:crypto";
import { existsSync, linkSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { calculateJwkThumbprint, exportJWK, generateKeyPair, importJWK, SignJWT, type JSONWebKeySet, type JWK } from "jose";
import type { Scope } from "../contracts/caller.ts";
import { AppError } from "../lib/errors.ts";
import { devAudience, devIssuer } from "../gateway/config.ts";

export interface DevKeys {
  privateJwk: JWK;
  jwks: JSONWebKeySet;
}

export { devAudience, devIssuer };

export function devKeyPath(dataDir: string): string {
  return join(dataDir, "keys", "dev-signing-key.json");
}

/** Loads the dev key from the data directory, creating it (ES256, mode 0600) on first use. */
export function ensureDevKeys(dataDir: string): Promise<DevKeys> {
  return ensureSigningKey(devKeyPath(dataDir));
}

/**
 * Loads the signing key (a private ES256 JWK) at `path`, creating it on first use (`ensureKeyFile`: mode 0600, safe
 * when gateways sharing SIGNING_KEY_FILE start at once).
 */
export async function ensureSigningKey(path: string): Promise<DevKeys> {
  await ensureKeyFile(path, async () => {
    const { privateKey } = await generateKeyPair("ES256", { extractable: true });
    const jwk = await exportJWK(privateKey);
    jwk.kid = await calculateJwkThumbprint(jwk);
    jwk.alg = "ES256";
    jwk.use = "sig";
    return JSON.stringify(jwk, null, 2);
  });
  return readSigningKey(path);
}

/**
 * Makes the key file at `path` with `make()`'s content unless it exists (mode 0600, its directory 0700 when made
 * here). Safe when several processes start at once on one file (gateways and hosts sharing it): each writes its key
 * whole under a temporary name and links it into place, which fails when the file exists; the first link wins and
 * the others read the winner's key.
 */
export async function ensureKeyFile(path: string, make: () => Promise<string>): Promise<void> {
  if (existsSync(path)) return;
  const content = await make();
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  writeFileSync(tmp, content, { mode: 0o600, flag: "wx" });
  try {
    linkSync(tmp, path);
  } catch (err) {
    // EEXIST: another process made it first (its key is the one). A filesystem without hard links: a rename that
    // replaces; two first starts at that same instant could then end with different keys (a restart agrees again).
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "EPERM" || code === "ENOTSUP" || code === "EOPNOTSUPP") {
      if (!existsSync(path)) renameSync(tmp, path);
    } else if (code !== "EEXIST") throw err;
  } finally {
    rmSync(tmp, { force: true });
  }
}

/** The signing key at `path` (a private JWK as ensureSigningKey writes it); a clear error when it is not one. */
export function readSigningKey(path: string): DevKeys {
  let jwk: JWK;
  try {
    jwk = JSON.parse(readFileSync(path, "utf8")) as JWK;
  } catch (err) {
    throw new AppError("bad_request", `configuration: the signing key ${path} cannot be read as JSON (${err instanceof Error ? err.message : String(err)})`);
  }
  if (jwk.kty !== "EC" || jwk.crv !== "P-256" || typeof jwk.d !== "string" || typeof jwk.kid !== "string") {
    throw new AppError(
      "bad_request",
      `configuration: ${path} is no private ES256 key with a kid (a JWK {"kty":"EC","crv":"P-256","d":…,"kid":…}, as the gateway makes it)`,
    );
  }
  return fromPrivateJwk(jwk);
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
