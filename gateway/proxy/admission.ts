// Admission of a proxied call, the one order every entry follows (the Hono app, the Node fast path, WebSocket upgrades).
//
// `admit(call, entry)` decides everything before a byte reaches the agent — the caller (token, its tenant), the agent
// (its row, its tenant), who may call it, the gateway's own answer to non-waking traffic, the declared body against
// the agent's limit, the tenant's concurrent-call limit — and then runs the entry's forward inside the scope of the
// tenant slot it took: the slot is given back when the forward's promise settles, however it settles (in the spirit
// of Knative's `throttler.Try(ctx, fn)`). An entry only routes, forwards and writes answers.
//
// Warm calls (the token and the agent in memory) are decided synchronously: no await, no promise until the forward.
import { AppError } from "../../lib/errors.ts";
import type { Caller } from "../../contracts/caller.ts";
import { bearerToken, type Authenticator } from "../auth.ts";
import type { ProxyCore, ResolvedAgent } from "./core.ts";
import type { PlainAnswer } from "./policy.ts";

/** What admission reads of a call to an agent (an entry's own call type adds what it needs to answer). */
export interface ProxyCall {
  agentId: string;
  method: string;
  /** Path and query inside the agent. */
  pathInside: string;
  /** The `Authorization` header as sent. */
  authorization: string | undefined;
  userAgent: string | undefined;
  /** The declared `Content-Length`, if any. */
  contentLength: string | null | undefined;
  requestId: string;
  /** A WebSocket upgrade: relayed to the agent, never answered by the non-waking rules (a probe does not upgrade). */
  upgrade: boolean;
}

/** What an entry does with a call admission decided (one object per entry, not per call). */
export interface ProxyEntry<C extends ProxyCall> {
  /** This entry's fleet relays WebSocket upgrades (else an upgrade is `502 bad_gateway`). */
  readonly relaysUpgrades: boolean;
  /** The caller this connection's last call showed with the same `Authorization` header, still valid (the fast path's memory). */
  rememberedCaller?(call: C): Caller | undefined;
  /** A token the authenticator knew from memory, for `rememberedCaller` next time. */
  remember?(call: C, known: { caller: Caller; until: number }): void;
  /** The gateway answers the call itself (non-waking traffic); nothing was taken. */
  answer(call: C, answer: PlainAnswer): void;
  /**
   * Forwards the admitted call. What it returns settles when the call is over — the response body ended, was cut or
   * cancelled, the WebSocket handed over — and the tenant slot is given back then. It answers the client itself once
   * the agent answered; a rejection (or a throw) means nothing was answered: admission passes it to `fail`.
   */
  forward(call: C, agent: ResolvedAgent, caller: Caller | undefined): Promise<unknown>;
  /** The call is refused or could not be forwarded: answer the error (the entry knows whether the client is still there). */
  fail(call: C, err: unknown): void;
}

export interface Admission {
  /** Decides `call` and answers it through `entry`: refused, answered by the gateway, or forwarded inside the tenant slot's scope. */
  admit<C extends ProxyCall>(call: C, entry: ProxyEntry<C>): void;
}

export function createAdmission(core: ProxyCore, auth: Authenticator): Admission {
  /** The caller is known and the agent is in memory: everything from here is decided without waiting. */
  function decide<C extends ProxyCall>(call: C, entry: ProxyEntry<C>, caller: Caller | undefined, agent: ResolvedAgent): void {
    let leave: () => void;
    try {
      // Who may call first: another tenant's private agent stays a 404, whatever its tenant's status.
      core.authorize(agent, caller);
      if (!call.upgrade) {
        const match = agent.matchNonWaking(call.method, call.pathInside, call.userAgent);
        if (match) {
          core.nonWakingAnswer(agent, match, call.method, call.pathInside, call.requestId).then(
            (answer) => entry.answer(call, answer),
            (err: unknown) => entry.fail(call, err),
          );
          return;
        }
      }
      core.checkDeclaredBody(agent, call.contentLength);
      if (call.upgrade && !entry.relaysUpgrades) throw new AppError("bad_gateway", "this gateway's fleet cannot relay WebSockets");
      leave = core.enter(agent);
    } catch (err) {
      return entry.fail(call, err);
    }
    // The scope of the tenant slot: given back once the forward is over, whichever way it ends.
    let over: Promise<unknown>;
    try {
      over = entry.forward(call, agent, caller);
    } catch (err) {
      leave();
      return entry.fail(call, err);
    }
    over.then(leave, (err: unknown) => {
      leave();
      entry.fail(call, err);
    });
  }

  /** A token to verify, a tenant to load or provision, an agent to read: then `decide`. */
  async function resolveThenDecide<C extends ProxyCall>(
    call: C,
    entry: ProxyEntry<C>,
    token: string | undefined,
    known: Caller | undefined,
    peeked: ResolvedAgent | undefined,
  ): Promise<void> {
    try {
      const caller = token === undefined ? undefined : (known ?? (await auth.verify(token)));
      // The token's tenant must be active (as on every route); its status is then in memory for `authorize`.
      if (caller) await core.admitCaller(caller, call.requestId);
      const agent = peeked ?? (await core.resolve(call.agentId));
      decide(call, entry, caller, agent);
    } catch (err) {
      entry.fail(call, err);
    }
  }

  return {
    admit(call, entry) {
      // A kept-alive connection usually repeats its Authorization header: its last caller costs less than parsing and
      // hashing a token of several hundred bytes on every call.
      const remembered = call.authorization === undefined ? undefined : entry.rememberedCaller?.(call);
      if (remembered) {
        const agent = core.peek(call.agentId);
        if (agent && core.callerReady(remembered)) return decide(call, entry, remembered, agent);
      }
      let token: string | undefined;
      try {
        token = bearerToken(call.authorization);
      } catch (err) {
        return entry.fail(call, err);
      }
      // Tokens the authenticator already verified are answered from its memory: the warm path then never awaits.
      const known = token === undefined ? undefined : auth.peek?.(token);
      if (known) entry.remember?.(call, known);
      const caller = known?.caller;
      const agent = core.peek(call.agentId);
      if (agent && (token === undefined || (caller && core.callerReady(caller)))) return decide(call, entry, caller, agent);
      void resolveThenDecide(call, entry, token, caller, agent);
    },
  };
}
