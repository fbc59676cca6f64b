// Waiting for a VM to be ready: one retry loop (deadline, back-off, early stop when the VM process died) and the
// probes the drivers wait on: the workload answers HTTP, a port accepts connections; plus a free loopback port.
//
// Before, each driver had its own loop and probe: qemu polled GET /healthz for a 200 every 25 ms, firecracker took
// any answer to GET / every 50 ms, their guest agent waits slept 10–200 ms. Kept: back-off from 10 ms to 100 ms;
// HTTP readiness = any HTTP answer to GET /healthz (any status proves the server is up, and /healthz keeps the
// probe off the agent's own routes; under QEMU's user networking a bare TCP accept proves nothing, the host side
// accepts before the guest does). The process driver keeps a TCP probe: its workloads may be any program given PORT.
import { request } from "node:http";
import { connect } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { connectOptions, endpointLabel, requestOptions } from "../../../lib/node-net.ts";
import type { VmEndpoint } from "../driver.ts";

export interface PollOptions {
  /** performance.now() after which the wait fails. */
  deadline: number;
  /** A reason to stop at once (e.g. the VM process exited), checked before every attempt. */
  gaveUp?: () => string | undefined;
  /** Start of the failure message when the deadline passes; the last attempt's error follows it. */
  timeout: string;
}

/**
 * Calls `attempt` until it resolves to a value (not undefined), backing off from 10 ms to 100 ms between tries;
 * throws when `gaveUp` names a reason or the deadline passes. There is always at least one attempt.
 */
export async function pollUntil<T>(attempt: (remainingMs: number) => Promise<T | undefined>, opts: PollOptions): Promise<T> {
  let last: unknown;
  for (let delay = 10; ; delay = Math.min(delay * 2, 100)) {
    const why = opts.gaveUp?.();
    if (why) throw new Error(why);
    try {
      const value = await attempt(Math.max(0, opts.deadline - performance.now()));
      if (value !== undefined) return value;
      last = undefined;
    } catch (err) {
      last = err;
    }
    if (performance.now() + delay > opts.deadline) break;
    await sleep(delay);
  }
  const detail = last instanceof Error ? `: ${last.message}` : "";
  throw new Error(`${opts.timeout}${detail}`);
}

/** Resolves once the workload at `endpoint` gives any HTTP answer to GET /healthz. */
export function waitForHttp(endpoint: VmEndpoint, opts: Omit<PollOptions, "timeout">): Promise<void> {
  return pollUntil(async (remaining) => ((await httpAnswers(endpoint, Math.min(2000, Math.max(100, remaining)))) ? true : undefined), {
    ...opts,
    timeout: `the workload did not answer HTTP on ${endpointLabel(endpoint)} in time`,
  }).then(() => undefined);
}

/** Resolves once something accepts TCP connections at `endpoint`. */
export function waitForTcp(endpoint: VmEndpoint, opts: Omit<PollOptions, "timeout">): Promise<void> {
  return pollUntil(async () => ((await tcpAccepts(endpoint)) ? true : undefined), {
    ...opts,
    timeout: `nothing listened on ${endpointLabel(endpoint)} in time`,
  }).then(() => undefined);
}

/** GET /healthz at `endpoint` gives any complete HTTP answer within the timeout. */
export function httpAnswers(endpoint: VmEndpoint, timeoutMs: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ ...requestOptions(endpoint), path: "/healthz", method: "GET", agent: false, timeout: timeoutMs }, (res) => {
      res.resume();
      res.on("end", () => resolve(true));
      res.on("error", () => resolve(false));
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(false));
    req.end();
  });
}

function tcpAccepts(endpoint: VmEndpoint): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(connectOptions(endpoint));
    sock.once("connect", () => {
      sock.destroy();
      resolve(true);
    });
    sock.once("error", () => resolve(false));
  });
}

export { freeLoopbackPort } from "../../../lib/node-net.ts";
