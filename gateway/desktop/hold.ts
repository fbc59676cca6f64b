// What a viewer holds while its socket is open, taken and given back as one: its session row (renewed, so other gateways see it live) and a keep-awake lease on the agent (renewed, so the agent's state shows the hold).
//
// Runtime-free. The exec relaying the socket keeps the VM awake by itself; the lease is what the dashboard, the
// agent's `leases` and the run report show. Failures to renew are logged, never the viewer's: a session that could not
// be renewed for its ttl is over for the other gateways (a takeover may then start beside it).
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import type { Logger } from "../../lib/log.ts";
import { sessionRenewMs, sessionTtlMs, type DesktopSession, type DesktopSessions } from "./sessions.ts";

export interface ViewerHold {
  /** Ends the session at `until` and drops the lease; idempotent. */
  release(until: Date): void;
}

export function holdForViewer(
  deps: { sessions: DesktopSessions; fleet: Pick<Fleet, "addLease" | "dropLease">; log: Logger },
  session: DesktopSession,
  /** The agent as it is at each renewal: a lease carries its spec to the host, and a PATCH since the connection (its idle timeout, say) must not be undone by it. */
  currentSpec: () => Promise<AgentSpec>,
  requestId: string,
): ViewerHold {
  const { sessions, fleet, log } = deps;
  const { agentId } = session;
  const quietly = (what: string) => (err: unknown) =>
    log.warn(`desktop viewer: ${what} failed`, { requestId, agentId, sessionId: session.id, err: err instanceof Error ? err.message : String(err) });
  let released = false;
  let leaseId: string | undefined;
  const holdOn = async () => {
    const lease = await fleet.addLease(await currentSpec(), sessionTtlMs);
    // A lease taken while the viewer was leaving goes at once (else it would hold the agent for its whole ttl).
    if (released) return void (await fleet.dropLease(agentId, lease.leaseId));
    const previous = leaseId;
    leaseId = lease.leaseId;
    if (previous) await fleet.dropLease(agentId, previous);
  };
  void holdOn().catch(quietly("taking the keep-awake lease"));
  const renewal = setInterval(() => {
    void sessions.renew(session.id, new Date(Date.now() + sessionTtlMs)).catch(quietly("renewing the session"));
    void holdOn().catch(quietly("renewing the keep-awake lease"));
  }, sessionRenewMs);
  return {
    release(until) {
      if (released) return;
      released = true;
      clearInterval(renewal);
      void sessions.close(session.id, until).catch(quietly("closing the session"));
      if (leaseId) void fleet.dropLease(agentId, leaseId).catch(quietly("dropping the keep-awake lease"));
    },
  };
}
