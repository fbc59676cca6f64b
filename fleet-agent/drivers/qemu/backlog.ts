// Builds a tiny LD_PRELOAD shim that raises QEMU's listen() backlog. libslirp (QEMU user networking)
// listens on forwarded ports with a backlog of 1: with more than two simultaneous connects the host
// kernel drops the handshake's last ACK and the clients wait 1, 2, 4 … 63 s, then get a reset. Measured
// here: 40 concurrent requests took 56 s and 9 were reset; with the shim all 40 finish in ≈ 0.35 s.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const LISTEN_BACKLOG = 256;

const SOURCE = `/* LD_PRELOAD for QEMU: libslirp listens on forwarded ports with backlog 1; raise it. */
#define _GNU_SOURCE
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
int listen(int fd, int backlog) {
  return (int)syscall(SYS_listen, fd, backlog < ${LISTEN_BACKLOG} ? ${LISTEN_BACKLOG} : backlog);
}
`;

/** Default place for the compiled shim: per user, keyed by the source so a change rebuilds it. */
export function defaultShimDir(): string {
  return join(tmpdir(), `agentvm-qemu-${process.getuid?.() ?? "user"}`);
}

/**
 * Returns the path of the compiled shim (building it with gcc on first use), or an error string when
 * it cannot be built; QEMU then runs without it and bursts of connections are slow.
 */
export function ensureListenBacklogShim(dir = defaultShimDir()): { path: string } | { error: string } {
  const hash = createHash("sha256").update(SOURCE).digest("hex").slice(0, 12);
  const path = join(dir, `listen-backlog-${hash}.so`);
  if (existsSync(path)) return { path };
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const src = join(dir, `listen-backlog-${hash}.${process.pid}.c`);
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(src, SOURCE);
    const r = spawnSync("gcc", ["-shared", "-fPIC", "-O2", "-o", tmp, src], { encoding: "utf8" });
    rmSync(src, { force: true });
    if (r.error) return { error: `gcc not available: ${r.error.message}` };
    if (r.status !== 0) return { error: `gcc failed: ${r.stderr.trim().split("\n").pop()}` };
    renameSync(tmp, path);
    return { path };
  } catch (err) {
    return { error: (err as Error).message };
  }
}
