// Builds the relay QEMU's guestfwd runs per guest connection to the egress proxy (relay.c) with gcc, once per source
// (lib/node-c-tool.ts).
import { join } from "node:path";
import { buildCTool, toolCacheDir } from "../../lib/node-c-tool.ts";

const SOURCE = join(import.meta.dirname, "relay.c");

/** Default place for the compiled relay: per user, beside QEMU's listen-backlog shim. */
export function defaultRelayDir(): string {
  return toolCacheDir("qemu");
}

/** The compiled relay's path (built on first use), or why it cannot be built: then no VM gets egress. */
export function ensureEgressRelay(dir = defaultRelayDir()): { path: string } | { error: string } {
  return buildCTool({ file: SOURCE }, "egress-relay", dir);
}
