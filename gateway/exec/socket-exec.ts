// A command through the exec path whose input is a WebSocket's (a terminal, a desktop viewer): the spec, then what
// the socket sends, as the call's streamed body, paced by the socket; the exec server's answer streams back.
import type { AgentSpec, WakeReason } from "../../contracts/agent.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { callGuest, noLimitMs } from "./guest.ts";

/** How long the exec server may take to answer a command's start (the agent's wake included), ms. */
const answerTimeoutMs = 30_000;

export interface SocketExec {
  /** The exec server's answer: frames until the command ends. */
  res: Response;
  /** Bytes for the command's input (dropped once it is closed); the socket is paused while the call reads none. */
  push(bytes: Uint8Array): void;
  /** Closes the command's input (its EOF; on a terminal its SIGHUP). Idempotent. */
  endInput(): void;
  /** Ends the call (its connection to the exec server closed: the command's process group is killed). */
  abort(reason: unknown): void;
  /** The socket the input comes from, once accepted: paused when the call's body is full, resumed when it reads. */
  attach(socket: { pause(): void; resume(): void }): void;
}

/**
 * Starts the command: `spec` is the request's first bytes (encodeSpec, with `stdin` or `tty`); the call ends when the
 * client's request is aborted. Rejects as `callGuest` does when the command could not start (nothing is accepted yet).
 */
export async function startSocketExec(
  fleet: Fleet,
  agent: AgentSpec,
  opts: { spec: Uint8Array; requestId: string; clientSignal: AbortSignal | undefined; reason?: WakeReason },
): Promise<SocketExec> {
  let input!: ReadableStreamDefaultController<Uint8Array>;
  let socket: { pause(): void; resume(): void } | undefined;
  const body = new ReadableStream<Uint8Array>(
    {
      start(controller) {
        input = controller;
        controller.enqueue(opts.spec);
      },
      pull() {
        socket?.resume();
      },
    },
    { highWaterMark: 8 },
  );
  const call = new AbortController();
  opts.clientSignal?.addEventListener("abort", () => call.abort(opts.clientSignal!.reason), { once: true });
  const res = await callGuest(fleet, agent, {
    method: "POST",
    path: "/v1/exec",
    body,
    headers: { "content-type": "application/octet-stream" },
    requestId: opts.requestId,
    signal: call.signal,
    responseTimeoutMs: answerTimeoutMs,
    idleTimeoutMs: noLimitMs,
    ...(opts.reason ? { reason: opts.reason } : {}),
  });
  let inputOpen = true;
  return {
    res,
    push(bytes) {
      if (!inputOpen) return;
      input.enqueue(bytes);
      if ((input.desiredSize ?? 1) <= 0) socket?.pause();
    },
    endInput() {
      if (!inputOpen) return;
      inputOpen = false;
      try {
        input.close();
      } catch {
        /* already cancelled by the call's end */
      }
    },
    abort: (reason) => call.abort(reason),
    attach(s) {
      socket = s;
    },
  };
}
