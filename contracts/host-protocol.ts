// The wire contract between gateways and a host's ingress: one signed, short-lived token per call that says exactly what the call may do.
import { AppError, errorStatus, type ErrorCode } from "../lib/errors.ts";
import { signComponentToken, verifyComponentToken } from "../lib/host-token.ts";
import { isDesktopSize, wakeReasons, type AgentSpec, type WakeReason } from "./agent.ts";

/** The component token travels in its own header: `Authorization` belongs to the agent's traffic. */
export const hostTokenHeader = "x-agentvm-host-token";
/** Set on answers the host itself gives (error envelopes), so an agent's own 502/503 is never mistaken for one. */
export const hostErrorHeader = "x-agentvm-error";

/**
 * What one call to a host may do. The gateway signs it into the token (issuer, audience `host:<hostId>`, HS256,
 * short expiry), so a host trusts the agent spec it is handed and a token cannot be reused for another agent,
 * another operation, or (for forward) another method or path.
 */
export type HostCall =
  /**
   * A call forwarded to the agent. With the agent's limits the host applies them (time the VM dozed counts towards
   * neither); without, its own upstream timeout (an older gateway).
   */
  | {
      op: "forward";
      agent: AgentSpec;
      reason: WakeReason;
      method: string;
      path: string;
      requestId: string;
      responseTimeoutMs?: number;
      proxyIdleTimeoutMs?: number;
      /** `exec`: to the VM's exec server (the host adds its key), not the agent's own server; absent: the agent's. */
      target?: "exec";
      /**
       * The gateway can repeat this call elsewhere (it has no body): a draining host that would have to wake the agent
       * for it answers `host_draining` instead, and the gateway places the agent again (a drain's move) and repeats it.
       */
      handOff?: true;
    }
  /** A WebSocket upgrade (GET with `Upgrade: websocket`) relayed by the host; the limits are the gateway's for this agent. */
  | { op: "websocket"; agent: AgentSpec; reason: WakeReason; path: string; requestId: string; proxyIdleTimeoutMs: number; responseTimeoutMs: number }
  /** `handOff` as for forward. */
  | { op: "wake"; agent: AgentSpec; reason: WakeReason; handOff?: true }
  | { op: "hibernate"; agentId: string }
  | { op: "status"; agentId: string }
  /** The live status of several agents in one call (a page of a list); at most `maxStatusesPerCall` ids. */
  | { op: "statuses"; agentIds: string[] }
  | { op: "lease"; agent: AgentSpec; ttlMs: number }
  | { op: "drop-lease"; agentId: string; leaseId: string }
  | { op: "remove"; agentId: string }
  /** The agent's log: the last `tailBytes`, then (with `follow`) what it writes next; streamed, wakes nothing. */
  | { op: "logs"; agentId: string; tailBytes: number; follow: boolean }
  /** Checkpoints (the agent's host keeps their files): take one, roll the agent back to one, fork a new agent from one, delete one. */
  | { op: "checkpoint"; agent: AgentSpec; name?: string; requestId?: string }
  | { op: "restore-checkpoint"; agent: AgentSpec; checkpointId: string; requestId?: string }
  | { op: "fork"; agent: AgentSpec; checkpointId: string; requestId?: string }
  | { op: "delete-checkpoint"; agentId: string; checkpointId: string }
  /** The host's warm templates (no agent: the token allows only this read). */
  | { op: "templates" };

export type HostOp = HostCall["op"];

/** Agent ids one `statuses` call carries: the ids ride in the token, which rides in a header (Node takes 16 KiB of them). */
export const maxStatusesPerCall = 100;

/** Where each operation is served on the ingress. */
export const hostOpPaths: Record<HostOp, string> = {
  forward: "/v1/forward",
  websocket: "/v1/websocket",
  wake: "/v1/wake",
  hibernate: "/v1/hibernate",
  status: "/v1/status",
  statuses: "/v1/statuses",
  lease: "/v1/lease",
  "drop-lease": "/v1/drop-lease",
  remove: "/v1/remove",
  logs: "/v1/logs",
  checkpoint: "/v1/checkpoint",
  "restore-checkpoint": "/v1/restore-checkpoint",
  fork: "/v1/fork",
  "delete-checkpoint": "/v1/delete-checkpoint",
  templates: "/v1/templates",
};

/** The HTTP method of a call: forward keeps the caller's, status(es), logs, templates and websocket (an upgrade) are GETs, the rest act. */
export function hostCallMethod(call: HostCall): string {
  if (call.op === "forward") return call.method;
  return call.op === "status" || call.op === "statuses" || call.op === "websocket" || call.op === "logs" || call.op === "templates" ? "GET" : "POST";
}

export async function signHostCall(key: Uint8Array, hostId: string, call: HostCall, ttlS = 30): Promise<string> {
  return signComponentToken(key, { sub: "gateway", aud: `host:${hostId}` }, ttlS, { call });
}

/** Verifies the token for this host (signature, issuer, audience, expiry) and answers the call it allows; 401 otherwise. */
export async function verifyHostCall(key: Uint8Array, hostId: string, token: string | undefined): Promise<HostCall> {
  const { call } = (await verifyComponentToken(key, token, `host:${hostId}`)).payload;
  if (!isHostCall(call)) throw new AppError("unauthorized", "component token carries no valid call");
  return call;
}

function optTrue(v: unknown): boolean {
  return v === undefined || v === true;
}

function optPositiveInt(v: unknown): boolean {
  return v === undefined || (Number.isInteger(v) && (v as number) > 0);
}

function isHostCall(v: unknown): v is HostCall {
  if (typeof v !== "object" || v === null) return false;
  const c = v as Record<string, unknown>;
  const str = (k: string) => typeof c[k] === "string" && c[k] !== "";
  const optStr = (k: string) => c[k] === undefined || str(k);
  switch (c.op) {
    case "forward":
      return (
        isAgentSpec(c.agent) &&
        isReason(c.reason) &&
        str("method") &&
        typeof c.path === "string" &&
        c.path.startsWith("/") &&
        str("requestId") &&
        optPositiveInt(c.responseTimeoutMs) &&
        optPositiveInt(c.proxyIdleTimeoutMs) &&
        (c.target === undefined || c.target === "exec") &&
        optTrue(c.handOff)
      );
    case "websocket":
      return (
        isAgentSpec(c.agent) &&
        isReason(c.reason) &&
        typeof c.path === "string" &&
        c.path.startsWith("/") &&
        str("requestId") &&
        Number.isInteger(c.proxyIdleTimeoutMs) &&
        (c.proxyIdleTimeoutMs as number) > 0 &&
        Number.isInteger(c.responseTimeoutMs) &&
        (c.responseTimeoutMs as number) > 0
      );
    case "wake":
      return isAgentSpec(c.agent) && isReason(c.reason) && optTrue(c.handOff);
    case "lease":
      return isAgentSpec(c.agent) && Number.isInteger(c.ttlMs) && (c.ttlMs as number) > 0;
    case "drop-lease":
      return str("agentId") && str("leaseId");
    case "logs":
      return str("agentId") && Number.isInteger(c.tailBytes) && (c.tailBytes as number) >= 0 && typeof c.follow === "boolean";
    case "statuses":
      return (
        Array.isArray(c.agentIds) &&
        c.agentIds.length > 0 &&
        c.agentIds.length <= maxStatusesPerCall &&
        c.agentIds.every((id) => typeof id === "string" && id !== "")
      );
    case "checkpoint":
      return isAgentSpec(c.agent) && optStr("name") && optStr("requestId");
    case "restore-checkpoint":
    case "fork":
      return isAgentSpec(c.agent) && str("checkpointId") && optStr("requestId");
    case "delete-checkpoint":
      return str("agentId") && str("checkpointId");
    case "templates":
      return true;
    case "hibernate":
    case "status":
    case "remove":
      return str("agentId");
    default:
      return false;
  }
}

function isReason(v: unknown): v is WakeReason {
  return typeof v === "string" && (wakeReasons as readonly string[]).includes(v);
}

function isAgentSpec(v: unknown): v is AgentSpec {
  if (typeof v !== "object" || v === null) return false;
  const a = v as Record<string, unknown>;
  const ints = ["vcpus", "memMiB", "idleTimeoutMs", "streamIdleMs"].every((k) => Number.isInteger(a[k]) && (a[k] as number) > 0);
  const disk = a.diskMiB === undefined || (Number.isInteger(a.diskMiB) && (a.diskMiB as number) > 0);
  const desktop = a.desktop === undefined || isDesktopSize(a.desktop);
  return (
    typeof a.id === "string" && typeof a.tenantId === "string" && typeof a.image === "string" && typeof a.allowEgress === "boolean" && ints && disk && desktop
  );
}

/** The AppError a host's error answer stands for (its envelope and Retry-After), read back on the gateway side. */
export async function hostErrorFrom(res: Response, hostId: string): Promise<AppError> {
  let code: string | undefined;
  let message = `host ${hostId} answered ${res.status}`;
  try {
    const body = (await res.json()) as { error?: { code?: unknown; message?: unknown } };
    if (typeof body.error?.code === "string") code = body.error.code;
    if (typeof body.error?.message === "string") message = body.error.message;
  } catch {
    /* not an envelope: the status line says enough */
  }
  const retryAfter = Number(res.headers.get("retry-after"));
  const retryAfterS = Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : undefined;
  if (code === "unauthorized" || code === "forbidden") {
    // The caller's token was fine: the gateway and the host disagree on COMPONENT_SECRET or the host id.
    return new AppError("bad_gateway", `host ${hostId} refused the gateway's component token: ${message}`);
  }
  if (code !== undefined && code in errorStatus) return new AppError(code as ErrorCode, message, { retryAfterS });
  return new AppError("bad_gateway", message, { retryAfterS });
}
