// Firecracker hybrid vsock, host side: reach a guest vsock port through the VM's unix socket.
//
// Handshake (Firecracker docs/vsock.md, host-initiated connections): connect to the vsock device's
// `uds_path`, send `CONNECT <port>\n`, and Firecracker answers `OK <host_port>\n` once the guest has
// accepted; if nothing listens on that guest port, Firecracker closes the connection instead. After the
// `OK` line the stream carries the guest application's bytes unchanged.
import { connect, type Socket } from "node:net";
import { GuestAgentClient } from "../common/guest-agent.ts";
import { pollUntil } from "../common/readiness.ts";

export class VsockConnectError extends Error {
  override name = "VsockConnectError";
}

/**
 * Opens a stream to guest vsock `port`. The socket is returned paused, with any bytes that arrived
 * right after the `OK` line put back: attach a reader, then call `resume()`.
 */
export function connectVsock(udsPath: string, port: number, opts: { timeoutMs?: number } = {}): Promise<{ socket: Socket; hostPort: number }> {
  const timeoutMs = opts.timeoutMs ?? 2000;
  return new Promise((resolve, reject) => {
    const socket = connect(udsPath);
    let buffered = Buffer.alloc(0);
    let settled = false;
    const timer = setTimeout(() => fail(new VsockConnectError(`vsock CONNECT ${port} via ${udsPath}: no answer within ${timeoutMs} ms`)), timeoutMs);
    const cleanup = () => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("error", onError);
      socket.off("close", onClose);
    };
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      cleanup();
      socket.destroy();
      reject(err);
    };
    const onError = (err: Error) => fail(new VsockConnectError(`vsock CONNECT ${port} via ${udsPath}: ${err.message}`));
    const onClose = () => fail(new VsockConnectError(`vsock CONNECT ${port} via ${udsPath}: closed before OK (nothing listening on the guest port yet?)`));
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      const nl = buffered.indexOf(0x0a);
      if (nl < 0) {
        if (buffered.length > 64)
          fail(new VsockConnectError(`vsock CONNECT ${port}: unexpected answer ${JSON.stringify(buffered.toString("latin1").slice(0, 64))}`));
        return;
      }
      const line = buffered.subarray(0, nl).toString("latin1").replace(/\r$/, "");
      const m = /^OK (\d+)$/.exec(line);
      if (!m) return fail(new VsockConnectError(`vsock CONNECT ${port}: unexpected answer ${JSON.stringify(line)}`));
      settled = true;
      socket.pause();
      cleanup();
      const rest = buffered.subarray(nl + 1);
      if (rest.length > 0) socket.unshift(rest);
      resolve({ socket, hostPort: Number(m[1]) });
    };
    socket.on("data", onData);
    socket.once("error", onError);
    socket.once("close", onClose);
    socket.once("connect", () => socket.write(`CONNECT ${port}\n`));
  });
}

/** One attempt: handshake, then a guest agent client on the stream, proven alive with a PING. */
export async function openGuestAgent(udsPath: string, port: number, opts: { timeoutMs?: number } = {}): Promise<GuestAgentClient> {
  const { socket } = await connectVsock(udsPath, port, opts);
  const agent = new GuestAgentClient(socket);
  socket.resume();
  try {
    await agent.ping(opts.timeoutMs ?? 2000);
  } catch (err) {
    agent.close();
    throw err;
  }
  return agent;
}

/**
 * Retries `openGuestAgent` until it answers or `deadlineMs` (from now) passes: right after boot or restore
 * the guest may not listen yet. `gaveUp` stops early (e.g. the VM process exited).
 */
export async function waitForGuestAgent(
  udsPath: string,
  port: number,
  opts: { deadlineMs: number; attemptTimeoutMs?: number; gaveUp?: () => string | undefined },
): Promise<GuestAgentClient> {
  const deadline = performance.now() + opts.deadlineMs;
  try {
    return await pollUntil((remaining) => openGuestAgent(udsPath, port, { timeoutMs: Math.min(opts.attemptTimeoutMs ?? 1000, Math.max(50, remaining)) }), {
      deadline,
      gaveUp: () => {
        const why = opts.gaveUp?.();
        return why && `guest agent unreachable: ${why}`;
      },
      timeout: `guest agent on vsock port ${port} did not answer within ${Math.max(0, Math.round(opts.deadlineMs))} ms`,
    });
  } catch (err) {
    throw new VsockConnectError((err as Error).message, { cause: err });
  }
}
