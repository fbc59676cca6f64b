// Builds a tiny LD_PRELOAD shim that raises QEMU's listen() backlog. libslirp (QEMU user networking)
// listens on forwarded ports with a backlog of 1: with more than two simultaneous connects the host
// kernel drops the handshake's last ACK and the clients wait 1, 2, 4 … 63 s, then get a reset. Measured
// here: 40 concurrent requests took 56 s and 9 were reset; with the shim all 40 finish in ≈ 0.35 s.
import { buildCTool, toolCacheDir, type CTool } from "../../../lib/node-c-tool.ts";

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
  return toolCacheDir("qemu");
}

/**
 * Returns the path of the compiled shim (building it with gcc on first use), or an error string when
 * it cannot be built; QEMU then runs without it and bursts of connections are slow.
 */
export function ensureListenBacklogShim(dir = defaultShimDir()): CTool {
  return buildCTool({ text: SOURCE }, "listen-backlog", dir, { shared: true });
}
