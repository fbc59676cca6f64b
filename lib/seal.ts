// Secrets sealed at rest (an upstream's headers): AES-256-GCM with a 32-byte key through WebCrypto, so the Worker and Node seal alike; `v1.<iv>.<tag>.<ciphertext>`, base64url.
import { AppError } from "./errors.ts";

export const SEAL_KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;

/** The key as WebCrypto holds it (not extractable: nothing can read it back out of the process's key object). */
export async function importSealKey(raw: Uint8Array): Promise<CryptoKey> {
  if (raw.length !== SEAL_KEY_BYTES) throw new AppError("bad_request", `configuration: a sealing key is ${SEAL_KEY_BYTES} bytes, this one is ${raw.length}`);
  return crypto.subtle.importKey("raw", raw.slice(), { name: "AES-GCM" }, false, ["encrypt", "decrypt"]);
}

/**
 * `plaintext` sealed under `key`; `context` (an upstream's id) is bound in as associated data, so a sealed value
 * copied to another row does not open there.
 */
export async function seal(key: CryptoKey, plaintext: string, context: string): Promise<string> {
  const iv = crypto.getRandomValues(new Uint8Array(IV_BYTES));
  const out = new Uint8Array(
    await crypto.subtle.encrypt({ name: "AES-GCM", iv, additionalData: utf8(context), tagLength: TAG_BYTES * 8 }, key, utf8(plaintext)),
  );
  // WebCrypto appends the tag to the ciphertext; the stored form names them apart.
  const ciphertext = out.subarray(0, out.length - TAG_BYTES);
  const tag = out.subarray(out.length - TAG_BYTES);
  return `v1.${base64url(iv)}.${base64url(tag)}.${base64url(ciphertext)}`;
}

/** The plaintext of a sealed value; AppError `internal` when it is malformed, tampered with, or sealed under another key or context. */
export async function unseal(key: CryptoKey, sealed: string, context: string): Promise<string> {
  const parts = sealed.split(".");
  if (parts.length !== 4 || parts[0] !== "v1") throw new AppError("internal", "a sealed value is not in the v1 form");
  const [iv, tag, ciphertext] = [parts[1]!, parts[2]!, parts[3]!].map(fromBase64url);
  if (!iv || !tag || !ciphertext || iv.length !== IV_BYTES || tag.length !== TAG_BYTES) throw new AppError("internal", "a sealed value is malformed");
  const joined = new Uint8Array(ciphertext.length + TAG_BYTES);
  joined.set(ciphertext);
  joined.set(tag, ciphertext.length);
  try {
    const plain = await crypto.subtle.decrypt({ name: "AES-GCM", iv, additionalData: utf8(context), tagLength: TAG_BYTES * 8 }, key, joined);
    return new TextDecoder().decode(plain);
  } catch {
    throw new AppError("internal", "a sealed value does not open with this key (tampered with, or sealed under another key)");
  }
}

/** A 32-byte key written as base64url (or standard base64) text, as UPSTREAM_KEY_FILE holds it; undefined when it is not one. */
export function parseSealKey(text: string): Uint8Array | undefined {
  const bytes = fromBase64url(text.trim().replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, ""));
  return bytes?.length === SEAL_KEY_BYTES ? bytes : undefined;
}

export function base64url(bytes: Uint8Array): string {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function fromBase64url(text: string): Uint8Array<ArrayBuffer> | undefined {
  if (!/^[A-Za-z0-9_-]*$/.test(text)) return undefined;
  try {
    const bin = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  } catch {
    return undefined;
  }
}

const utf8 = (s: string) => new TextEncoder().encode(s);
