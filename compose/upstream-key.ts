// The key upstreams' secret headers are sealed with (lib/seal.ts): made at the first start in the data directory, or read from UPSTREAM_KEY_FILE that gateways and hosts share.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../lib/errors.ts";
import { base64url, parseSealKey, SEAL_KEY_BYTES } from "../lib/seal.ts";
import { ensureKeyFile } from "./dev-keys.ts";

export function upstreamKeyPath(dataDir: string): string {
  return join(dataDir, "keys", "upstream-key");
}

/** The key at `path` (32 bytes as base64url text), made there on first use (mode 0600, race-safe: dev-keys.ts `ensureKeyFile`). */
export async function ensureUpstreamKey(path: string): Promise<Uint8Array> {
  await ensureKeyFile(path, async () => `${base64url(randomBytes(SEAL_KEY_BYTES))}\n`);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (err) {
    throw new AppError("bad_request", `configuration: the upstream key ${path} cannot be read (${err instanceof Error ? err.message : String(err)})`);
  }
  const key = parseSealKey(text);
  if (!key)
    throw new AppError("bad_request", `configuration: ${path} is no upstream key (${SEAL_KEY_BYTES} bytes written as base64url, as the gateway makes it)`);
  return key;
}
