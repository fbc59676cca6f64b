// The gateway's view of the fleet, in web types only: an in-process adapter (one host) and an HTTP one (remote hosts) implement it.
//
// Runtimes add to it where they can do more: the Node gateway's extension (direct connections to a VM, WebSocket
// relays on raw sockets) is `NodeFleet` in gateway/node/fleet.ts.
import type { AgentSpec, Lease, VmState, VmStatus, WakeInfo, WakeReason, WakeTimings } from "./agent.ts";

export interface ForwardContext {
  requestId: string;
  reason: WakeReason;
  /** Aborts the upstream call when the client goes away. */
  signal?: AbortSignal;
  /**
   * The agent's response and idle timeouts, for a fleet that applies them itself where the VM runs (`appliesLimits`):
   * only its host knows how long the VM dozed (fleet-agent/host/doze.ts), time that counts towards neither.
   */
  limits?: SocketLimits;
  /**
   * Where on the VM the request goes: the agent's own server (`workload`, the default), or the exec server inside its
   * VM (`exec`: commands, files and background processes, gateway/exec/), to which the agent's host adds the VM's key
   * itself (the key never leaves the host). Only the gateway's exec and files routes set it: no client header can.
   */
  target?: ForwardTarget;
  /** The caller repeats the call elsewhere if need be: a draining host does not wake the agent for it (`host_draining`). */
  handOff?: boolean;
}

/** What a forwarded request reaches inside the VM (`ForwardContext.target`). */
export type ForwardTarget = "workload" | "exec";

/** The agent's limits a relayed WebSocket obeys: no byte either way for `proxyIdleTimeoutMs` closes it (1001); the agent's handshake answer within `responseTimeoutMs`. */
export interface SocketLimits {
  proxyIdleTimeoutMs: number;
  responseTimeoutMs: number;
}

export interface Fleet {
  /**
   * The fleet applies an agent's response and idle timeouts itself, by the host where the VM runs, when `forward` gets
   * them (`ForwardContext.limits`); the gateway then sets no timer of its own (it cannot see the VM doze). A remote fleet.
   */
  readonly appliesLimits?: boolean;
  /**
   * Sends `req` (URL = the path inside the agent; headers already forwarded) to the agent, waking it first.
   * The response streams; it carries `x-wake` and `server-timing` with the wake breakdown.
   */
  forward(agent: AgentSpec, req: Request, ctx: ForwardContext): Promise<Response>;
  /**
   * Optional: a WebSocket upgrade where there are no raw sockets (Workers): `req` (URL = the path inside the agent,
   * headers forwarded) goes to the host with a fetch upgrade; answers the host's `101` (carrying the runtime's
   * `webSocket`) as is, or the agent's refusal. The host relays frames and applies the idle rules.
   */
  upgradeFetch?(agent: AgentSpec, req: Request, ctx: ForwardContext & SocketLimits): Promise<Response>;
  wake(agent: AgentSpec, reason: WakeReason, opts?: { handOff?: boolean }): Promise<WakeInfo>;
  /** Optional: chooses the agent's host now (at creation), so agents spread by free capacity before their first call; absent: the first call places it. */
  place?(agent: AgentSpec): Promise<void>;
  hibernate(agentId: string): Promise<VmState>;
  status(agentId: string): Promise<VmStatus | undefined>;
  /** The status of each of `agentIds` its host knows, in one read (a page of a list); agents no host has are absent. */
  statuses(agentIds: readonly string[]): Promise<Map<string, VmStatus>>;
  addLease(agent: AgentSpec, ttlMs: number): Promise<Lease>;
  dropLease(agentId: string, leaseId: string): Promise<boolean>;
  remove(agentId: string): Promise<void>;
  /** The agent's log (console + workload output): the last `tailBytes`, then, with `follow`, new output as it comes until `signal` aborts. Undefined when the host has no such agent. */
  logs(agentId: string, opts: LogReadOptions): Promise<ReadableStream<Uint8Array> | undefined>;
  /**
   * Optional (absent: 501 checkpoints_unsupported): keeps an immutable copy of the agent's memory and disk on its host,
   * recorded in the checkpoints table; waits for a wake or snapshot under way. 409 conflict on a name the agent already
   * uses, or when the agent never ran (nothing to copy); 501 when the host's driver cannot.
   */
  checkpoint?(agent: AgentSpec, opts: CheckpointRequest): Promise<CheckpointView>;
  /** Optional: rolls the agent back to one of its checkpoints; an awake agent is stopped first. Answers the state it is left in (`hibernated`). */
  restoreCheckpoint?(agent: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState>;
  /** Optional: makes a new agent (never run, placed on the checkpoint's host) a hibernated copy of the checkpoint; its first wake restores it. */
  fork?(agent: AgentSpec, checkpointId: string, requestId?: string): Promise<VmState>;
  /** Optional: removes a checkpoint's files and marks its row deleted. */
  deleteCheckpoint?(agentId: string, checkpointId: string): Promise<void>;
  /**
   * Optional (absent: the API lists none): the warm templates new agents are cloned from, on every live host (one
   * list per host, merged); a host that does not answer is left out (and logged), never a failure of the whole list.
   */
  templates?(): Promise<TemplateView[]>;
}

/** A template's state: being booted and checkpointed, ready to clone, or its last build failed (tried again later). */
export type TemplateState = "building" | "ready" | "failed";

/** A warm template of one kind of VM (image, memory, vCPUs, egress) on one host, as the operator sees it: never the host's paths. */
export interface TemplateView {
  hostId: string;
  /** What the template is of, hashed (image, resources, egress, hypervisor and guest versions): a change makes a new key. */
  key: string;
  image: string;
  memMiB: number;
  vcpus: number;
  allowEgress: boolean;
  state: TemplateState;
  /** ISO 8601 (ready). */
  createdAt?: string;
  /** Bytes its files hold (ready). */
  bytes?: number;
  /** The template VM's cold boot, ms (ready). */
  bootMs?: number;
  /** Why its last build failed (failed). */
  error?: string;
}

/** What a checkpoint may be named: 1–100 of letters, digits, `. _ : -`, never starting like an id (`ckp_…`), so a name never reads as one. */
export const checkpointNamePattern = /^(?!ckp_)[A-Za-z0-9][\w.:-]{0,99}$/;

/** What a checkpoint is asked with. */
export interface CheckpointRequest {
  /** Unique among the agent's live checkpoints; none: unnamed. */
  name?: string;
  /** The API call that asked (recorded on the row). */
  requestId?: string;
}

/** A checkpoint as its host recorded it (a row of the checkpoints table). */
export interface CheckpointView {
  id: string;
  tenantId: string;
  agentId: string;
  hostId: string;
  name: string | null;
  origin: "api" | "guest";
  bytes: number;
  pausedMs: number;
  /** ISO 8601. */
  createdAt: string;
}

/** How much of an agent's log to read, and whether to go on with what it writes next. Reading a log never wakes the agent. */
export interface LogReadOptions {
  tailBytes: number;
  follow: boolean;
  signal?: AbortSignal;
}

const serverTimingNames: Partial<Record<keyof WakeTimings, string>> = { queuedMs: "queue", restoreMs: "restore", clockFixMs: "clockfix", bootMs: "boot" };

/**
 * `server-timing` entries for a wake: what the client waited for, in ms; a restore's sleep tier as its description
 * (`restore;dur=6.9;desc=kept`), so a client tells a wake from a kept QEMU from one that started a new QEMU.
 */
export function serverTiming(timings: WakeTimings): string {
  let out = "";
  for (const key of Object.keys(serverTimingNames) as (keyof WakeTimings)[]) {
    const value = timings[key];
    if (value === undefined) continue;
    out += `${out ? ", " : ""}${serverTimingNames[key]};dur=${value}`;
    if (key === "restoreMs" && timings.tier) out += `;desc=${timings.tier}`;
  }
  return out;
}

/** One call to an agent's exec server (gateway/exec/guest.ts `callGuest`): its method, path and body on the server, and its limits. */
export interface GuestCall {
  method: "GET" | "POST" | "PUT" | "DELETE";
  /** Path and query on the exec server (`/v1/exec`, `/v1/files?path=…`). */
  path: string;
  body?: Uint8Array | ReadableStream<Uint8Array> | null;
  headers?: Record<string, string>;
  requestId: string;
  /** The client went away: the call to the VM ends (and with it the command's connection). */
  signal?: AbortSignal;
  /** Until the exec server's answer head, ms (an upload's whole body comes before it). */
  responseTimeoutMs: number;
  /** The answer's body moving no byte for this long is cut, ms. */
  idleTimeoutMs: number;
  /** What the wake is put down to (the run's `wakeReason`): `api` unless the caller is the desktop API (`desktop`). */
  reason?: WakeReason;
}
