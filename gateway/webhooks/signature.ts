// Webhook signatures with Web Crypto: Standard Webhooks (`v1,` base64 HMAC-SHA256 of id.timestamp.body) and GitHub (`sha256=` hex).
import { AppError } from "../../lib/errors.ts";
import type { WebhookScheme } from "../../schema/webhooks.ts";
import { base64Decode, base64Encode, concatBytes, constantTimeEqual, hexDecode, hexEncode, randomBytes, utf8Bytes } from "./bytes.ts";

const standardPrefix = "whsec_";
/** More entries than any sender rotating keys needs; bounds the work one request can cause. */
const maxSignatureEntries = 16;

export async function hmacSha256(key: Uint8Array, data: Uint8Array): Promise<Uint8Array> {
  const cryptoKey = await crypto.subtle.importKey("raw", key as Uint8Array<ArrayBuffer>, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", cryptoKey, data as Uint8Array<ArrayBuffer>));
}

/** The HMAC key of a Standard Webhooks secret: the base64 after `whsec_` (the prefix is optional, as in the reference libraries). */
export function standardSecretKey(secret: string): Uint8Array {
  const key = base64Decode(secret.startsWith(standardPrefix) ? secret.slice(standardPrefix.length) : secret);
  if (!key || key.byteLength === 0) throw new AppError("internal", "webhook secret is not valid base64");
  return key;
}

/** GitHub uses the secret's UTF-8 bytes as the key, whatever they look like. */
export function githubSecretKey(secret: string): Uint8Array {
  return utf8Bytes(secret);
}

/** What Standard Webhooks signs: `${id}.${timestamp}.` followed by the body's raw bytes (never re-encoded). */
function standardSignedContent(id: string, timestamp: string, body: Uint8Array): Uint8Array {
  return concatBytes(utf8Bytes(`${id}.${timestamp}.`), body);
}

/** `v1,<base64>` — one entry of a `webhook-signature` header. */
export async function signStandard(secret: string, id: string, timestamp: number | string, body: Uint8Array): Promise<string> {
  return `v1,${base64Encode(await hmacSha256(standardSecretKey(secret), standardSignedContent(id, String(timestamp), body)))}`;
}

/** `sha256=<hex>` — the `X-Hub-Signature-256` header. */
export async function signGithub(secret: string, body: Uint8Array): Promise<string> {
  return `sha256=${hexEncode(await hmacSha256(githubSecretKey(secret), body))}`;
}

/** A new secret, shown to the user once: `whsec_` + 24 random bytes in base64 (the Standard Webhooks format), or 32 in hex. */
export function generateSecret(scheme: WebhookScheme): string {
  return scheme === "standard" ? `${standardPrefix}${base64Encode(randomBytes(24))}` : hexEncode(randomBytes(32));
}

export interface VerifyInput {
  scheme: WebhookScheme;
  headers: Headers;
  body: Uint8Array;
  /** Every secret that verifies right now: the current one and, during a rotation's overlap, the previous one. */
  secrets: readonly string[];
  nowMs: number;
  toleranceS: number;
}

export interface Verified {
  /** The sender's delivery id: what replays are recognised by. */
  externalId: string;
  /** Index into `secrets` of the one that matched. */
  secretIndex: number;
}

const invalid = (message: string) => new AppError("invalid_signature", message);

/**
 * Verifies a webhook request's signature before anything else looks at its content; throws `invalid_signature` (401)
 * for a missing header, a wrong signature, or (Standard Webhooks) a timestamp outside the tolerance either way.
 */
export async function verifyWebhook(input: VerifyInput): Promise<Verified> {
  return input.scheme === "standard" ? verifyStandard(input) : verifyGithub(input);
}

async function verifyStandard({ headers, body, secrets, nowMs, toleranceS }: VerifyInput): Promise<Verified> {
  const id = headers.get("webhook-id");
  const timestamp = headers.get("webhook-timestamp");
  const signature = headers.get("webhook-signature");
  const missing = [!id && "webhook-id", !timestamp && "webhook-timestamp", !signature && "webhook-signature"].filter(Boolean);
  if (!id || !timestamp || !signature) throw invalid(`missing ${missing.join(", ")} header`);
  if (!/^\d{1,12}$/.test(timestamp)) throw invalid("webhook-timestamp must be whole seconds since the epoch");

  const offered = signature
    .split(" ")
    .filter((entry) => entry.startsWith("v1,"))
    .slice(0, maxSignatureEntries)
    .map((entry) => base64Decode(entry.slice(3)))
    .filter((mac): mac is Uint8Array => mac !== undefined);
  const content = standardSignedContent(id, timestamp, body);
  const secretIndex = await firstMatch(secrets.map(standardSecretKey), content, offered);
  if (secretIndex < 0) throw invalid("no webhook-signature entry matches");

  // Checked after the signature, so an unsigned request learns nothing about the clock.
  const skewS = Math.floor(nowMs / 1000) - Number(timestamp);
  if (skewS > toleranceS) throw invalid(`webhook-timestamp is ${skewS} s old, more than the ${toleranceS} s tolerance`);
  if (-skewS > toleranceS) throw invalid(`webhook-timestamp is ${-skewS} s in the future, more than the ${toleranceS} s tolerance`);
  return { externalId: id, secretIndex };
}

async function verifyGithub({ headers, body, secrets }: VerifyInput): Promise<Verified> {
  const signature = headers.get("x-hub-signature-256");
  if (!signature) throw invalid("missing X-Hub-Signature-256 header");
  const mac = signature.startsWith("sha256=") ? hexDecode(signature.slice("sha256=".length)) : undefined;
  const secretIndex = await firstMatch(secrets.map(githubSecretKey), body, mac ? [mac] : []);
  if (secretIndex < 0) throw invalid("X-Hub-Signature-256 does not match");
  // GitHub signs only the body: the delivery id is unsigned and GitHub sends no timestamp (see the README, "Webhooks").
  const deliveryId = headers.get("x-github-delivery");
  if (!deliveryId) throw new AppError("bad_request", "missing X-GitHub-Delivery header");
  return { externalId: deliveryId, secretIndex };
}

/** Index of the first key whose MAC of `content` equals one of `offered`, or -1; every comparison is constant-time. */
async function firstMatch(keys: Uint8Array[], content: Uint8Array, offered: Uint8Array[]): Promise<number> {
  for (const [i, key] of keys.entries()) {
    const expected = await hmacSha256(key, content);
    let matched = false;
    for (const mac of offered) matched = constantTimeEqual(expected, mac) || matched;
    if (matched) return i;
  }
  return -1;
}

export interface EndpointSecrets {
  secret: string;
  previousSecret: string | null;
  previousSecretExpiresAt: Date | null;
}

/** The secrets that verify at `nowMs`: the current one, plus the previous one until its overlap ends. */
export function activeSecrets(e: EndpointSecrets, nowMs: number): string[] {
  const previousActive = e.previousSecret !== null && e.previousSecretExpiresAt !== null && e.previousSecretExpiresAt.getTime() > nowMs;
  return previousActive ? [e.secret, e.previousSecret as string] : [e.secret];
}
