// The gateway's view of the fleet: one interface, an in-process adapter (all-in-one) and an HTTP one (remote hosts).
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import type { Lease, Ticket } from "./host.ts";
import type { AgentSpec, VmState, VmStatus, WakeInfo, WakeReason } from "./types.ts";

export interface ForwardContext {
  requestId: string;
  reason: WakeReason;
  /** Aborts the upstream call when the client goes away. */
  signal?: AbortSignal;
}

/** A WebSocket upgrade handed to a fleet that relays it itself (`Fleet.upgrade`). */
export interface UpgradeContext extends ForwardContext {
  /** Path and query inside the agent. */
  pathInside: string;
  /** The handshake's headers for the agent, flat (`upgradeRequestHeaders`: forwarded, hop-by-hop dropped); its `host` is replaced. */
  headers: string[];
  /** The agent's limits: no byte either way for this long closes the socket with 1001; the agent's handshake answer within the other. */
  proxyIdleTimeoutMs: number;
  responseTimeoutMs: number;
}

export interface Fleet {
  /**
   * Sends `req` (URL = the path inside the agent; headers already forwarded) to the agent, waking it first.
   * The response streams; it carries `x-wake` and `server-timing` with the wake breakdown.
   */
  forward(agent: AgentSpec, req: Request, ctx: ForwardContext): Promise<Response>;
  /**
   * Optional, for a gateway that talks HTTP/1.1 to the agent itself (the Node fast path, WebSockets): holds the agent
   * awake (waking it first, single-flight, counted like `forward`) and says where it listens. The caller must
   * `release()` the ticket exactly once, `touch()` it while bytes move, call `streaming()` once the response (or
   * WebSocket) is open, and close its stream when `onHibernate` fires. Fleets whose agents the gateway cannot reach
   * directly (remote hosts) leave it out; the fast path then goes through `forward`, and WebSockets through `upgrade`
   * (refused when that is missing too).
   */
  acquire?(agent: AgentSpec, ctx: ForwardContext): Promise<Ticket>;
  /**
   * Optional, Node only, for fleets without `acquire` (remote hosts): relays a WebSocket upgrade through the agent's
   * host, which wakes the agent and follows the frames. Resolves once the socket is handed over (the `101` and
   * everything after it, or the agent's refusal, written to `socket`); rejects with an AppError when nothing was
   * written yet, so the caller answers with the error envelope.
   */
  upgrade?(agent: AgentSpec, req: IncomingMessage, socket: Duplex, head: Buffer, ctx: UpgradeContext): Promise<void>;
  /**
   * A WebSocket upgrade where there are no raw sockets (Workers): `req` (URL = the path inside the agent, headers
   * forwarded) goes to the host with a fetch upgrade; answers the host's `101` (carrying the runtime's `webSocket`)
   * as is, or the agent's refusal. The host relays frames and applies the idle rules, as for `upgrade`.
   */
  upgradeFetch?(agent: AgentSpec, req: Request, ctx: ForwardContext & { proxyIdleTimeoutMs: number; responseTimeoutMs: number }): Promise<Response>;
  wake(agent: AgentSpec, reason: WakeReason): Promise<WakeInfo>;
  hibernate(agentId: string): Promise<VmState>;
  status(agentId: string): Promise<VmStatus | undefined>;
  addLease(agent: AgentSpec, ttlMs: number): Promise<Lease>;
  dropLease(agentId: string, leaseId: string): Promise<boolean>;
  remove(agentId: string): Promise<void>;
}

/** `server-timing` entries for a wake: what the client waited for, in ms. */
export function serverTiming(timings: Record<string, number>): string {
  const names: Record<string, string> = { queuedMs: "queue", restoreMs: "restore", clockFixMs: "clockfix", bootMs: "boot" };
  return Object.entries(names)
    .filter(([k]) => timings[k] !== undefined)
    .map(([k, name]) => `${name};dur=${timings[k]}`)
    .join(", ");
}
