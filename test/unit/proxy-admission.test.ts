// The one admission of a proxied call: its order, the synchronous warm path, and the tenant slot given back by its scope.
import { describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import type { Caller } from "../../contracts/caller.ts";
import type { Authenticator } from "../../gateway/auth.ts";
import type { ProxyCore, ResolvedAgent } from "../../gateway/proxy/core.ts";
import { createAdmission, type ProxyCall, type ProxyEntry } from "../../gateway/proxy/admission.ts";
import type { PlainAnswer } from "../../gateway/proxy/policy.ts";

const caller: Caller = { tenantId: "ten_a", subject: "u", scopes: new Set(["agents:invoke"]) };
const agent = {
  row: { id: "agt_a", tenantId: "ten_a" },
  matchNonWaking: (_m: string, path: string) => (path === "/robots.txt" ? "path" : undefined),
  limits: { maxBodyBytes: 10 },
} as unknown as ResolvedAgent;

/** A core that records the steps admission takes (warm: the agent and the caller's tenant in memory). */
function fakeCore(opts: { warm: boolean; refuse?: AppError }) {
  const steps: string[] = [];
  let slots = 0;
  const core = {
    peek: () => (opts.warm ? agent : undefined),
    callerReady: () => opts.warm,
    async admitCaller() {
      steps.push("admitCaller");
    },
    async resolve() {
      steps.push("resolve");
      return agent;
    },
    authorize() {
      steps.push("authorize");
      if (opts.refuse) throw opts.refuse;
    },
    async nonWakingAnswer(): Promise<PlainAnswer> {
      steps.push("nonWakingAnswer");
      return { status: 200, headers: {}, body: "robots" };
    },
    checkDeclaredBody(_a: ResolvedAgent, length: string | null | undefined) {
      steps.push("checkDeclaredBody");
      if (Number(length) > 10) throw new AppError("payload_too_large", "too large");
    },
    enter() {
      steps.push("enter");
      slots++;
      return () => {
        steps.push("leave");
        slots--;
      };
    },
  } as unknown as ProxyCore;
  return { core, steps, slots: () => slots };
}

const auth: Authenticator = {
  async verify() {
    return caller;
  },
  peek: () => undefined,
};

const call = (over: Partial<ProxyCall> = {}): ProxyCall => ({
  agentId: "agt_a",
  method: "GET",
  pathInside: "/x",
  authorization: undefined,
  userAgent: undefined,
  contentLength: undefined,
  requestId: "req_1",
  upgrade: false,
  ...over,
});

/** An entry that records what it was asked; `forward` is the test's. */
function entry(forward: ProxyEntry<ProxyCall>["forward"], relaysUpgrades = true) {
  const seen: { answered?: PlainAnswer; failed?: unknown; forwarded: number } = { forwarded: 0 };
  const e: ProxyEntry<ProxyCall> = {
    relaysUpgrades,
    answer: (_c, a) => (seen.answered = a),
    fail: (_c, err) => (seen.failed = err),
    forward: (c, a, who) => {
      seen.forwarded++;
      return forward(c, a, who);
    },
  };
  return { e, seen };
}

const tick = () => new Promise((r) => setTimeout(r, 0));

describe("admission", () => {
  it("decides a warm call synchronously and gives the slot back only when the forward is over", async () => {
    const { core, steps, slots } = fakeCore({ warm: true });
    let finish!: () => void;
    const { e, seen } = entry(() => new Promise<void>((r) => (finish = r)));
    createAdmission(core, auth).admit(call(), e);
    expect(seen.forwarded).toBe(1); // no await before the forward
    expect(steps).toEqual(["authorize", "checkDeclaredBody", "enter"]);
    await tick();
    expect(slots()).toBe(1); // the handler's return is not the end of the call
    finish();
    await tick();
    expect(slots()).toBe(0);
    expect(seen.failed).toBeUndefined();
  });

  it("a cold call verifies the token, admits its tenant, reads the agent, then decides", async () => {
    const { core, steps } = fakeCore({ warm: false });
    const { e, seen } = entry(async () => undefined);
    createAdmission(core, auth).admit(call({ authorization: "Bearer t" }), e);
    expect(seen.forwarded).toBe(0);
    await tick();
    expect(steps).toEqual(["admitCaller", "resolve", "authorize", "checkDeclaredBody", "enter", "leave"]);
  });

  it("gives the slot back when the forward throws or rejects, and reports the failure once", async () => {
    for (const forward of [
      () => {
        throw new Error("sync");
      },
      () => Promise.reject(new Error("async")),
    ]) {
      const { core, slots } = fakeCore({ warm: true });
      const { e, seen } = entry(forward);
      createAdmission(core, auth).admit(call(), e);
      await tick();
      expect(slots()).toBe(0);
      expect(seen.failed).toBeInstanceOf(Error);
    }
  });

  it("refusals and the gateway's own answers take no slot; an upgrade is relayed, never answered by the non-waking rules", async () => {
    const refused = fakeCore({ warm: true, refuse: new AppError("not_found", "no") });
    const r = entry(async () => undefined);
    createAdmission(refused.core, auth).admit(call(), r.e);
    expect(r.seen.failed).toMatchObject({ code: "not_found" });
    expect(refused.steps).toEqual(["authorize"]);

    const probe = fakeCore({ warm: true });
    const p = entry(async () => undefined);
    createAdmission(probe.core, auth).admit(call({ pathInside: "/robots.txt" }), p.e);
    await tick();
    expect(p.seen.answered?.body).toBe("robots");
    expect(probe.steps).toEqual(["authorize", "nonWakingAnswer"]);

    const big = fakeCore({ warm: true });
    const b = entry(async () => undefined);
    createAdmission(big.core, auth).admit(call({ contentLength: "11" }), b.e);
    expect(b.seen.failed).toMatchObject({ code: "payload_too_large" });
    expect(big.steps).not.toContain("enter");

    const ws = fakeCore({ warm: true });
    const w = entry(async () => undefined);
    createAdmission(ws.core, auth).admit(call({ pathInside: "/robots.txt", upgrade: true }), w.e);
    expect(w.seen.forwarded).toBe(1);

    const noRelay = fakeCore({ warm: true });
    const n = entry(async () => undefined, false);
    createAdmission(noRelay.core, auth).admit(call({ upgrade: true }), n.e);
    expect(n.seen.failed).toMatchObject({ code: "bad_gateway" });
    expect(noRelay.steps).not.toContain("enter");
  });
});
