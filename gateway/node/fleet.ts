// What a Node gateway can ask of a fleet beyond the web-only port: a direct hold on an awake VM, and WebSocket relays on raw sockets.
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import type { WakeInfo } from "../../contracts/agent.ts";
import type { PortEndpoint } from "../../lib/node-net.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Fleet, ForwardContext, SocketLimits } from "../../contracts/fleet.ts";

/** One call's hold on an awake agent: the VM stays awake while the hold lasts. */
export interface AgentHold {
  /** Where the agent listens (the gateway talks HTTP/1.1 to it directly). */
  readonly endpoint: PortEndpoint;
  readonly wake: WakeInfo;
  /** Bytes moved either way: keeps a long stream counting as work. */
  touch(): void;
  /** The agent answered: from now on the hold counts only while bytes move within the stream idle window. */
  streaming(): void;
  /** The first response byte reached the client (recorded on the run this call woke). */
  firstByte(): void;
  /** What to do if the host hibernates under this (idle) stream: abort it. */
  onHibernate(fn: () => void): void;
  /**
   * How long the VM has dozed so far, ms (only grows; fleet-agent/host/doze.ts): what it grew by while a timeout ran is
   * left out of it (the agent waited on an outbound call). Absent: the VM never dozes.
   */
  dozedMs?(): number;
}

/** A WebSocket upgrade handed to the fleet, which wakes the agent and relays the frames (activity, 1001 before hibernating). */
export interface UpgradeContext extends ForwardContext, SocketLimits {
  /** Path and query inside the agent. */
  pathInside: string;
  /** The handshake's headers for the agent, flat (`upgradeRequestHeaders`: forwarded, hop-by-hop dropped); its `host` is replaced. */
  headers: string[];
  /** The handshake is over, however it ended (the tenant's slot is given back). */
  handshakeDone?: () => void;
}

export interface NodeFleet extends Fleet {
  /**
   * Optional, where the gateway can reach the VM itself (one process): wakes the agent (single-flight, counted like
   * `forward`), then runs `use` with a hold on it; the hold is released when `use`'s promise settles, so it cannot
   * be forgotten. Fleets whose VMs the gateway cannot reach (remote hosts) leave it out and are called through `forward`.
   */
  withHold?<T>(agent: AgentSpec, ctx: ForwardContext, use: (hold: AgentHold) => Promise<T>): Promise<T>;
  /**
   * Relays a WebSocket upgrade: the agent's host wakes it and follows the frames. Resolves once the socket is handed
   * over (the `101` and everything after it, or the agent's refusal, written to `socket`); rejects with an AppError
   * when nothing was written yet, so the caller answers with the error envelope. Missing: WebSockets are refused.
   */
  upgrade?(agent: AgentSpec, req: IncomingMessage, socket: Duplex, head: Buffer, ctx: UpgradeContext): Promise<void>;
}
