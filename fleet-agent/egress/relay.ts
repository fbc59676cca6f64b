// Builds the relay QEMU's guestfwd runs per guest connection to the egress proxy (relay.c) with gcc, once per source:
// the binary is cached in a per-user temp directory under a name holding the source's hash, so a change rebuilds it.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const SOURCE = join(import.meta.dirname, "relay.c");

/** Default place for the compiled relay: per user, beside QEMU's listen-backlog shim. */
export function defaultRelayDir(): string {
  return join(tmpdir(), `agentvm-qemu-${process.getuid?.() ?? "user"}`);
}

/** The compiled relay's path (built on first use), or why it cannot be built: then no VM gets egress. */
export function ensureEgressRelay(dir = defaultRelayDir()): { path: string } | { error: string } {
  try {
    const hash = createHash("sha256").update(readFileSync(SOURCE)).digest("hex").slice(0, 12);
    const path = join(dir, `egress-relay-${hash}`);
    if (existsSync(path)) return { path };
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const tmp = `${path}.${process.pid}.tmp`;
    const r = spawnSync("gcc", ["-O2", "-Wall", "-o", tmp, SOURCE], { encoding: "utf8" });
    if (r.error) return { error: `gcc not available: ${r.error.message}` };
    if (r.status !== 0) {
      rmSync(tmp, { force: true });
      return { error: `gcc failed: ${r.stderr.trim().split("\n").pop()}` };
    }
    renameSync(tmp, path);
    return { path };
  } catch (err) {
    return { error: (err as Error).message };
  }
}
