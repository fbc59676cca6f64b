// The Fleet over HTTP (fetch: Node and Workers): each call goes to the agent's host with a fresh gateway-signed token.
import { AppError } from "../lib/errors.ts";
import type { Logger } from "../lib/log.ts";
import type { CheckpointView, Fleet, ForwardContext, TemplateView } from "../contracts/fleet.ts";
import {
  hostCallMethod,
  hostErrorFrom,
  hostErrorHeader,
  hostOpPaths,
  hostTokenHeader,
  maxStatusesPerCall,
  signHostCall,
  type HostCall,
} from "../contracts/host-protocol.ts";
import type { AgentSpec, Lease, VmState, VmStatus, WakeInfo } from "../contracts/agent.ts";
import type { PlacedHost, Placement } from "./placement.ts";

/** How a gateway reaches hosts: `fetch` on Workers; on Node an undici client that leaves bodies encoded (remote-fleet-node.ts). */
export type HostFetch = (req: Request) => Promise<Response>;

/** A placement that can also name the live hosts (with an ingress URL): `templates` asks each of them. */
export interface HostListing {
  liveHosts?(): Promise<PlacedHost[]>;
}

export interface RemoteFleetDeps {
  /** Without `liveHosts`, the fleet has no `templates` (the API lists none). */
  placement: Placement & HostListing;
  /** `componentKey(COMPONENT_SECRET)`, shared with the hosts. */
  key: Uint8Array;
  log: Logger;
  fetch?: HostFetch;
  /** Lifetime of each call's token: it only has to outlive the trip to the host. */
  tokenTtlS?: number;
  /** Time a control call (wake excluded: it waits for the VM) may take before it fails with 504. */
  controlTimeoutMs?: number;
}

/** `statuses` calls a page of a list has in flight at once (one per host and batch of ids). */
const statusConcurrency = 8;
/**
 * Tries of a repeatable call that a draining host refuses (`host_draining`): the offer to hand the agent off, then the
 * call without it, once more if the host could not claim the agent in the database in time (a database slow under load).
 */
const drainingTries = 3;
/** A call's body up to this size (declared by its Content-Length) is read before it is sent, so it can be sent again (`handedOff`). */
const repeatableBodyBytes = 64 * 1024;

export function createRemoteFleet(deps: RemoteFleetDeps): Fleet {
  const { placement, key, log } = deps;
  const hostFetch: HostFetch = deps.fetch ?? ((req) => fetch(req));
  const ttlS = deps.tokenTtlS ?? 30;
  const controlTimeoutMs = deps.controlTimeoutMs ?? 30_000;

  /** Sends one call to `host`; host-side errors come back as the same AppError codes. */
  async function send(host: PlacedHost, call: HostCall, init: { headers?: Headers; body?: BodyInit | null; signal?: AbortSignal } = {}): Promise<Response> {
    const headers = init.headers ?? new Headers();
    headers.set(hostTokenHeader, await signHostCall(key, host.id, call, ttlS));
    const reqInit: RequestInit & { duplex?: "half" } = { method: hostCallMethod(call), headers, redirect: "manual" };
    if (init.body) {
      reqInit.body = init.body;
      reqInit.duplex = "half";
    }
    if (init.signal) reqInit.signal = init.signal;
    const agentIds = "agent" in call ? [call.agent.id] : "agentIds" in call ? call.agentIds : "agentId" in call ? [call.agentId] : [];
    let res: Response;
    try {
      res = await hostFetch(new Request(withSlash(host.url) + hostOpPaths[call.op].slice(1), reqInit));
    } catch (err) {
      if (init.signal?.aborted) throw err; // the client went away: nothing to report
      if (err instanceof AppError) throw err;
      for (const id of agentIds) placement.forget(id);
      placement.unreachable?.(host);
      const message = err instanceof Error ? (err.cause instanceof Error ? `${err.message}: ${err.cause.message}` : err.message) : String(err);
      log.warn("host unreachable", { hostId: host.id, url: host.url, op: call.op, agentId: agentIds[0], agents: agentIds.length, err: message });
      // 503 + Retry-After, not 502: once the host's lease ends the next call is placed on another host.
      throw new AppError("host_unavailable", `host ${host.id} unreachable: ${message}`, { retryAfterS: 2, cause: err });
    }
    if (res.headers.has(hostErrorHeader)) {
      const error = await hostErrorFrom(res, host.id);
      // A stale lease generation, or a host whose clock is off (it drains itself): ask the database next time.
      if (error.code === "host_unavailable" || error.code === "clock_skew") for (const id of agentIds) placement.forget(id);
      if (error.code === "bad_gateway" && res.status === 401) {
        // Tokens name the host they are for: the process at this URL is not the agent's host (any more), or does not
        // share our secret. Either way the placement kept for the agent is not to be trusted: ask the database next time.
        for (const id of agentIds) placement.forget(id);
        log.error("host refused the gateway's component token", { hostId: host.id, err: error.message });
      }
      throw error;
    }
    return res;
  }

  async function control<T>(host: PlacedHost, call: HostCall, timeoutMs: number | undefined): Promise<T> {
    const signal = timeoutMs === undefined ? undefined : AbortSignal.timeout(timeoutMs);
    try {
      const res = await send(host, call, signal ? { signal } : {});
      return (await res.json()) as T;
    } catch (err) {
      if (signal?.aborted) throw new AppError("gateway_timeout", `host ${host.id} did not answer ${call.op} within ${timeoutMs} ms`, { cause: err });
      throw err;
    }
  }

  /**
   * Sends a call that may wake the agent. When it can be repeated (`repeatable`), its first try lets a draining host
   * refuse to wake the sleeping agent (`host_draining`): then the agent is placed again, which moves it off the
   * draining host when its state can go (gateway/placement.ts), and the call goes once more, wherever it is placed,
   * without the offer. Otherwise the agent would wake on the draining host for as long as calls come, and never move.
   * A draining host also answers `host_draining` to a call without the offer when the database did not confirm its
   * claim in time (fleet-agent/host/fencing.ts): nothing reached the agent, so the call is placed and sent again, up to
   * `drainingTries` in all, before the client sees the 503.
   */
  async function handedOff<T>(spec: AgentSpec, repeatable: boolean, send: (host: PlacedHost, handOff: boolean) => Promise<T>): Promise<T> {
    const host = await placement.hostFor(spec);
    if (!repeatable) return send(host, false);
    for (let tries = 1; ; tries++) {
      try {
        return await send(tries === 1 ? host : await placement.hostFor(spec), tries === 1);
      } catch (err) {
        if (!(err instanceof AppError) || err.code !== "host_draining" || tries === drainingTries) throw err;
        placement.forget(spec.id);
      }
    }
  }

  async function status(agentId: string): Promise<VmStatus | undefined> {
    const host = await placement.currentHost(agentId);
    if (!host) return undefined;
    try {
      return (await control<{ status: VmStatus | null }>(host, { op: "status", agentId }, controlTimeoutMs)).status ?? undefined;
    } catch (err) {
      // A listing must not fail because one host is down: the agent row's last known state stands in.
      log.warn("agent status unavailable", { agentId, hostId: host.id, err: err instanceof Error ? err.message : String(err) });
      return undefined;
    }
  }

  /** Every live host's templates, one call each at once, merged by host then key; a host that fails is left out and logged. */
  async function templates(listHosts: () => Promise<PlacedHost[]>): Promise<TemplateView[]> {
    const hosts = await listHosts();
    const lists = await Promise.all(
      hosts.map(async (host) => {
        try {
          return (await control<{ templates: TemplateView[] }>(host, { op: "templates" }, controlTimeoutMs)).templates;
        } catch (err) {
          log.warn("host templates unavailable", { hostId: host.id, url: host.url, err: err instanceof Error ? err.message : String(err) });
          return [];
        }
      }),
    );
    return lists.flat().sort((a, b) => a.hostId.localeCompare(b.hostId) || a.key.localeCompare(b.key));
  }
  const liveHosts = placement.liveHosts?.bind(placement);

  return {
    // The agent's host applies its response and idle timeouts: it alone sees the VM doze (fleet-agent/host/doze.ts).
    appliesLimits: true,
    ...(liveHosts ? { templates: () => templates(liveHosts) } : {}),
    async forward(spec: AgentSpec, req: Request, ctx: ForwardContext): Promise<Response> {
      const url = new URL(req.url);
      const hasBody = req.body !== null && req.method !== "GET" && req.method !== "HEAD";
      // A call without a body, or with a small one read here first, can be sent twice: it offers a draining host to
      // hand the agent off (see `handedOff`). A larger body streams once.
      const declared = Number(req.headers.get("content-length") ?? Number.NaN);
      const small = hasBody && declared <= repeatableBodyBytes;
      const body = small ? await req.arrayBuffer() : hasBody ? req.body : null;
      return handedOff(spec, !hasBody || small, (host, handOff) => {
        const call: HostCall = {
          op: "forward",
          agent: leased(spec, host),
          reason: ctx.reason,
          method: req.method,
          path: url.pathname + url.search,
          requestId: ctx.requestId,
          ...(ctx.limits ? { responseTimeoutMs: ctx.limits.responseTimeoutMs, proxyIdleTimeoutMs: ctx.limits.proxyIdleTimeoutMs } : {}),
          // Signed into the token with the rest: a client's headers cannot pick it.
          ...(ctx.target === "exec" ? { target: "exec" as const } : {}),
          ...(handOff ? { handOff: true as const } : {}),
        };
        return send(host, call, { headers: new Headers(req.headers), body, ...(ctx.signal ? { signal: ctx.signal } : {}) });
      });
    },
    async upgradeFetch(spec, req, ctx) {
      const host = await placement.hostFor(spec);
      const agent = leased(spec, host);
      const url = new URL(req.url);
      const call: HostCall = {
        op: "websocket",
        agent,
        reason: ctx.reason,
        path: url.pathname + url.search,
        requestId: ctx.requestId,
        proxyIdleTimeoutMs: ctx.proxyIdleTimeoutMs,
        responseTimeoutMs: ctx.responseTimeoutMs,
      };
      const headers = new Headers(req.headers);
      headers.set("upgrade", "websocket"); // the runtime's fetch makes the WebSocket handshake with the host
      return send(host, call, { headers, ...(ctx.signal ? { signal: ctx.signal } : {}) });
    },
    async wake(spec, reason) {
      return handedOff(spec, true, (host, handOff) =>
        control<WakeInfo>(host, { op: "wake", agent: leased(spec, host), reason, ...(handOff ? { handOff: true as const } : {}) }, undefined),
      );
    },
    async place(spec) {
      await placement.hostFor(spec);
    },
    async hibernate(agentId) {
      const host = await placement.currentHost(agentId);
      if (!host) return "hibernated" satisfies VmState; // never ran anywhere: nothing awake
      return (await control<{ state: VmState }>(host, { op: "hibernate", agentId }, undefined)).state;
    },
    status,
    async statuses(agentIds) {
      // One look-up of the agents' hosts, then one call per host and batch of ids, a few at a time.
      const hosts = await placement.currentHosts(agentIds);
      const byHost = new Map<string, { host: PlacedHost; ids: string[] }>();
      for (const [id, host] of hosts) {
        const group = byHost.get(host.id) ?? { host, ids: [] };
        group.ids.push(id);
        byHost.set(host.id, group);
      }
      const calls = [...byHost.values()].flatMap(({ host, ids }) => chunks(ids, maxStatusesPerCall).map((batch) => ({ host, batch })));
      const out = new Map<string, VmStatus>();
      let next = 0;
      const worker = async () => {
        while (next < calls.length) {
          const { host, batch } = calls[next++]!;
          try {
            const { statuses } = await control<{ statuses: Record<string, VmStatus> }>(host, { op: "statuses", agentIds: batch }, controlTimeoutMs);
            for (const id of batch) if (statuses[id]) out.set(id, statuses[id]);
          } catch (err) {
            // A listing must not fail because one host is down: those agents' rows' last known state stands in.
            log.warn("agent statuses unavailable", { hostId: host.id, agents: batch.length, err: err instanceof Error ? err.message : String(err) });
          }
        }
      };
      await Promise.all(Array.from({ length: Math.min(statusConcurrency, calls.length) }, worker));
      return out;
    },
    async addLease(spec, ttlMs) {
      const host = await placement.hostFor(spec);
      return control<Lease>(host, { op: "lease", agent: leased(spec, host), ttlMs }, undefined);
    },
    async dropLease(agentId, leaseId) {
      const host = await placement.currentHost(agentId);
      if (!host) return false;
      return (await control<{ dropped: boolean }>(host, { op: "drop-lease", agentId, leaseId }, controlTimeoutMs)).dropped;
    },
    async remove(agentId) {
      const host = await placement.currentHost(agentId);
      if (!host) return;
      if (!host.live) {
        // Its host is gone (no heartbeat): deleting the agent must still be possible; the host's disk keeps its files.
        log.warn("agent deleted while its host is not live; its files stay on that host", { agentId, hostId: host.id });
        placement.forget(agentId);
        return;
      }
      await control<{ removed: boolean }>(host, { op: "remove", agentId }, controlTimeoutMs);
      placement.forget(agentId);
    },
    // Checkpoints are the agent's host's: its files are there (a fork's row names that host before its first call).
    async checkpoint(agent, opts) {
      const host = await placement.currentHost(agent.id);
      if (!host) throw new AppError("conflict", `agent ${agent.id} has never run: there is no state to checkpoint`);
      return control<CheckpointView>(host, { op: "checkpoint", agent: leased(agent, host), ...opts }, undefined);
    },
    async restoreCheckpoint(agent, checkpointId, requestId) {
      const host = await placement.currentHost(agent.id);
      if (!host) throw new AppError("not_found", `agent ${agent.id} has no host to restore on`);
      return (
        await control<{ state: VmState }>(
          host,
          { op: "restore-checkpoint", agent: leased(agent, host), checkpointId, ...(requestId ? { requestId } : {}) },
          undefined,
        )
      ).state;
    },
    async fork(agent, checkpointId, requestId) {
      const host = await placement.currentHost(agent.id);
      if (!host) throw new AppError("wake_failed", `the host of checkpoint ${checkpointId} has no ingress URL`, { retryAfterS: 10 });
      return (await control<{ state: VmState }>(host, { op: "fork", agent: leased(agent, host), checkpointId, ...(requestId ? { requestId } : {}) }, undefined))
        .state;
    },
    async deleteCheckpoint(agentId, checkpointId) {
      const host = await placement.currentHost(agentId);
      if (!host) throw new AppError("not_found", `checkpoint ${checkpointId} not found`);
      await control<{ deleted: boolean }>(host, { op: "delete-checkpoint", agentId, checkpointId }, controlTimeoutMs);
    },
    async logs(agentId, opts) {
      // Wherever the agent was placed, awake or not: reading its log wakes nothing. Never placed: it has no log yet.
      const host = await placement.currentHost(agentId);
      if (!host) return undefined;
      const res = await send(host, { op: "logs", agentId, tailBytes: opts.tailBytes, follow: opts.follow }, opts.signal ? { signal: opts.signal } : {});
      if (res.status === 204 || !res.body) return undefined;
      return res.body;
    },
  };
}

/** The spec a host is handed: with the lease generation the agent holds on that host. */
export function leased(spec: AgentSpec, host: PlacedHost): AgentSpec {
  return host.generation ? { ...spec, generation: host.generation } : spec;
}

function withSlash(url: string): string {
  return url.endsWith("/") ? url : `${url}/`;
}

function chunks<T>(items: readonly T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}
