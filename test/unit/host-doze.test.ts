// The host's doze (fleet-agent/host/doze.ts) on the host core with a fake driver and a hand-driven clock: when a VM
// dozes and what keeps it running, every trigger that runs it again (with the event log's reasons and the meter's
// alternation), an answer racing the pause, DOZE_MAX_MS, and what a failed pause or resume leaves.
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { Host } from "../../fleet-agent/host.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import type { RunningVm, VmDriver, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";

const agent: AgentSpec = {
  id: "agt_doze0001",
  tenantId: "ten_d",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 60_000,
  streamIdleMs: 1000,
  allowEgress: true,
};
const vmId = "vm_doze0001";

/** A gate a test opens by hand: the driver's pause or resume waits on it when set. */
function gate() {
  let open!: () => void;
  let fail!: (err: Error) => void;
  const promise = new Promise<void>((resolve, reject) => {
    open = resolve;
    fail = reject;
  });
  return { promise, open, fail };
}

function fakeDriver(opts: { pausable?: boolean } = {}) {
  const calls = { pause: 0, resume: 0, stop: 0, hibernate: 0 };
  const knobs = {
    cpuSeconds: 0,
    guestLeases: 0,
    pauseGate: undefined as ReturnType<typeof gate> | undefined,
    resumeGate: undefined as ReturnType<typeof gate> | undefined,
    pauseError: undefined as Error | undefined,
    resumeError: undefined as Error | undefined,
  };
  const vm = (spec: VmSpec): RunningVm => ({ spec, endpoint: { host: "127.0.0.1", port: 9 }, pid: 42 });
  const driver: VmDriver = {
    name: "qemu",
    isolated: true,
    logPath: (spec) => `${spec.stateDir}/console.log`,
    boot: async (spec) => ({ vm: vm(spec), bootMs: 100 }),
    hibernate: async () => {
      calls.hibernate++;
      return { completed: true, snapshotMs: 10, bytes: 1 };
    },
    wake: async (spec) => ({ vm: vm(spec), mode: "restore", timings: { restoreMs: 10, clockFixMs: 1, skewBeforeMs: 1, skewAfterMs: 0 } }),
    stop: async () => {
      calls.stop++;
    },
    destroy: async () => {},
    cpuSeconds: async () => knobs.cpuSeconds,
    guestLeases: async () => knobs.guestLeases,
    onExit: () => {},
    reap: async () => {},
    close: async () => {},
  };
  if (opts.pausable !== false) {
    driver.pause = async () => {
      calls.pause++;
      if (knobs.pauseGate) await knobs.pauseGate.promise;
      if (knobs.pauseError) throw knobs.pauseError;
    };
    driver.resume = async () => {
      calls.resume++;
      if (knobs.resumeGate) await knobs.resumeGate.promise;
      if (knobs.resumeError) throw knobs.resumeError;
      return { clockFixMs: 3 };
    };
  }
  return { driver, calls, knobs };
}

function setup(o: { afterMs?: number; pausable?: boolean } = {}) {
  const clock = new ManualClock();
  const fake = fakeDriver({ pausable: o.pausable ?? true });
  const store = createMemoryHostStore();
  const meter: string[] = [];
  const host = new Host({
    config: {
      hostId: "host_d",
      vmsDir: "/nonexistent/agentvm-doze-test",
      wakeQueueLimit: 10,
      wakeDeadlineMs: 5000,
      reaperIntervalMs: 1000,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
      doze: { afterMs: o.afterMs ?? 200, maxMs: 60_000 },
    },
    driver: fake.driver,
    store,
    clock,
    log: silentLogger,
    activity: {
      active: (e) => meter.push(`active:${e.reason}`),
      inactive: (e) => meter.push(`inactive:${e.reason}`),
      doze: (e) => meter.push(e.dozing ? "doze" : "resume"),
    },
  });
  const obs = host.exchanges;
  /** Lets the fake driver's answers and the host's continuations run. */
  const settle = async () => {
    for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
  };
  /** Moves the clock `ms` forward, then lets what it started finish. */
  const advance = async (ms: number) => {
    clock.advance(ms);
    await settle();
  };
  const state = () => host.status(agent.id)?.state;
  const moves = async () => {
    await host.flush();
    return store.transitions.filter((t) => t.fromState === "dozing" || t.toState === "dozing").map((t) => `${t.fromState}>${t.toState}:${t.reason}`);
  };
  /** The VM running with one inbound call waiting for its answer, and one outbound exchange of it waiting. */
  const callWaitingOnModel = async () => {
    const ticket = await host.acquire(agent, "request");
    obs.waiting(vmId, "ex1");
    return ticket;
  };
  return { clock, fake, store, meter, host, obs, settle, advance, state, moves, callWaitingOnModel };
}

describe("host doze: when a VM dozes", () => {
  it("dozes once an outbound exchange waited DOZE_AFTER_MS with an inbound call waiting, and not before", async () => {
    const { fake, host, meter, advance, state, moves, callWaitingOnModel } = setup();
    const ticket = await callWaitingOnModel();
    await advance(199);
    expect(state()).toBe("running");
    expect(fake.calls.pause).toBe(0);
    await advance(1);
    expect(fake.calls.pause).toBe(1);
    expect(state()).toBe("dozing");
    expect(await moves()).toEqual(["running>dozing:doze"]);
    expect(meter).toEqual(["active:request", "doze"]);
    expect(host.status(agent.id)?.inFlight).toBe(1); // the inbound call is still open
    ticket.release();
  });

  it("a token stream on another exchange (answer bytes every 50 ms) keeps it running; the quiet after it dozes it", async () => {
    const { fake, obs, advance, state, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    for (let i = 0; i < 10; i++) {
      await advance(50);
      obs.answer(vmId, "stream");
    }
    expect(state()).toBe("running");
    expect(fake.calls.pause).toBe(0);
    await advance(200);
    expect(state()).toBe("dozing");
  });

  it("inbound bytes within the window keep it running (a streaming call), an idle stream does not", async () => {
    const { fake, advance, state, callWaitingOnModel } = setup();
    const ticket = await callWaitingOnModel();
    ticket.streaming();
    for (let i = 0; i < 6; i++) {
      await advance(100);
      ticket.touch();
    }
    expect(state()).toBe("running");
    expect(fake.calls.pause).toBe(0);
    await advance(200);
    expect(state()).toBe("dozing");
  });

  it("an API lease keeps it running until the lease is dropped", async () => {
    const { host, advance, state, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    const lease = await host.addLease(agent, 10_000);
    await advance(1000);
    expect(state()).toBe("running");
    host.dropLease(agent.id, lease.leaseId);
    await advance(200);
    expect(state()).toBe("dozing");
  });

  it("a guest lease keeps it running", async () => {
    const { fake, advance, state, callWaitingOnModel } = setup();
    fake.knobs.guestLeases = 1;
    await callWaitingOnModel();
    await advance(1000);
    expect(state()).toBe("running");
    expect(fake.calls.pause).toBe(0);
    fake.knobs.guestLeases = 0;
    await advance(200);
    expect(state()).toBe("dozing");
  });

  it("a busy guest CPU (at or above the threshold over the window) keeps it running", async () => {
    const { fake, clock, settle, state, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    for (let i = 0; i < 10; i++) {
      fake.knobs.cpuSeconds += 0.1; // 0.1 s of CPU per 100 ms: a whole core
      clock.advance(100);
      await settle();
    }
    expect(state()).toBe("running");
    clock.advance(200); // the CPU went quiet
    await settle();
    clock.advance(200);
    await settle();
    expect(state()).toBe("dozing");
  });

  it("no waiting exchange (only answers, or none at all) never dozes", async () => {
    const { obs, host, advance, state } = setup();
    const ticket = await host.acquire(agent, "request");
    obs.waiting(vmId, "ex1");
    obs.answer(vmId, "ex1"); // answered at once: not waiting any more
    await advance(5000);
    expect(state()).toBe("running");
    ticket.release();
  });

  it("never dozes with DOZE_AFTER_MS=0, nor on a driver that cannot pause", async () => {
    for (const o of [{ afterMs: 0 }, { pausable: false }]) {
      const { advance, state, callWaitingOnModel } = setup(o);
      await callWaitingOnModel();
      await advance(5000);
      expect(state()).toBe("running");
    }
  });
});

describe("host doze: what runs it again", () => {
  it("an answer: the bytes wait for the resume (reason upstream, dozeMs and clockFixMs), the meter alternates", async () => {
    const { fake, obs, store, host, meter, advance, settle, state, moves, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    await advance(200);
    await advance(5000);
    fake.knobs.resumeGate = gate();
    const answered = obs.answer(vmId, "ex1");
    expect(answered).toBeInstanceOf(Promise);
    let written = false;
    void answered!.then(() => (written = true));
    await settle();
    expect(written).toBe(false); // held until the VM runs
    expect(state()).toBe("dozing");
    fake.knobs.resumeGate.open();
    await settle();
    expect(written).toBe(true);
    expect(state()).toBe("running");
    expect(await moves()).toEqual(["running>dozing:doze", "dozing>running:upstream"]);
    const resumed = store.transitions.at(-1)!;
    expect(resumed.timings).toMatchObject({ dozeMs: 5000, clockFixMs: 3 });
    expect(meter).toEqual(["active:request", "doze", "resume"]);
    // The answer is flowing: a later chunk is written at once, and the VM does not doze again.
    expect(obs.answer(vmId, "ex1")).toBeUndefined();
    await advance(5000);
    expect(state()).toBe("running");
    await host.flush();
    expect(store.agentRows.get(agent.id)?.state).toBe("running");
  });

  it("a new inbound call (request), a webhook, an API wake, a lease: each resumes it with its reason before the call gets its hold", async () => {
    const { obs, host, advance, moves, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    const expected: string[] = [];
    const triggers: [string, () => Promise<unknown>][] = [
      ["request", async () => (await host.acquire(agent, "request")).release()],
      ["webhook", async () => (await host.acquire(agent, "webhook")).release()],
      ["api", () => host.wake(agent)],
      ["api", () => host.addLease(agent, 1)],
    ];
    for (const [reason, trigger] of triggers) {
      await advance(200);
      expect(host.status(agent.id)?.state).toBe("dozing");
      await trigger();
      expect(host.status(agent.id)?.state).toBe("running");
      expect(obs.answer(vmId, "nothing")).toBeUndefined();
      expected.push("running>dozing:doze", `dozing>running:${reason}`);
      await advance(10); // the lease (1 ms) expires
    }
    expect(await moves()).toEqual(expected);
  });

  it("a byte of an open inbound call (a WebSocket frame) resumes it (request)", async () => {
    const { advance, state, moves, callWaitingOnModel } = setup();
    const ticket = await callWaitingOnModel();
    await advance(200);
    expect(state()).toBe("dozing");
    ticket.touch();
    await advance(0);
    expect(state()).toBe("running");
    expect((await moves()).at(-1)).toBe("dozing>running:request");
  });

  it("an exchange that ends (the far end closed) resumes it so the guest hears it", async () => {
    const { obs, advance, state, moves, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    await advance(200);
    obs.ended(vmId, "ex1");
    await advance(0);
    expect(state()).toBe("running");
    expect((await moves()).at(-1)).toBe("dozing>running:upstream");
  });

  it("DOZE_MAX_MS: the guest's timers get a turn (doze_max), then it dozes again after DOZE_AFTER_MS", async () => {
    const { advance, state, moves, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    await advance(200);
    await advance(59_999);
    expect(state()).toBe("dozing");
    await advance(1);
    expect(state()).toBe("running");
    await advance(200);
    expect(state()).toBe("dozing");
    expect(await moves()).toEqual(["running>dozing:doze", "dozing>running:doze_max", "running>dozing:doze"]);
  });

  it("the hold's dozed time grows while it dozes, so timeouts can leave it out", async () => {
    const { obs, advance, callWaitingOnModel } = setup();
    const ticket = await callWaitingOnModel();
    const before = ticket.dozedMs();
    await advance(200);
    await advance(3000);
    expect(ticket.dozedMs() - before).toBe(3000);
    await obs.answer(vmId, "ex1");
    await advance(1000);
    expect(ticket.dozedMs() - before).toBe(3000);
  });

  it("an API hibernate of a VM dozing with no call open resumes it, then snapshots it", async () => {
    const { fake, obs, host, advance, moves } = setup();
    (await host.acquire(agent, "request")).release();
    obs.waiting(vmId, "bg");
    await advance(200);
    expect(host.status(agent.id)?.state).toBe("dozing");
    expect(await host.hibernateNow(agent.id)).toBe("hibernated");
    expect(fake.calls.resume).toBe(1);
    expect(fake.calls.hibernate).toBe(1);
    expect((await moves()).at(-1)).toBe("dozing>running:api");
  });

  it("an API hibernate while a call waits on the dozing VM is refused without resuming it", async () => {
    const { fake, host, advance, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    await advance(200);
    await expect(host.hibernateNow(agent.id)).rejects.toMatchObject({ code: "conflict" });
    expect(fake.calls.resume).toBe(0);
    expect(host.status(agent.id)?.state).toBe("dozing");
  });

  it("a delete stops a dozing VM as it is (no resume), its meter ends (delete)", async () => {
    const { fake, host, meter, advance, state, store, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    await advance(200);
    await host.remove(agent.id);
    expect(fake.calls.resume).toBe(0);
    expect(fake.calls.stop).toBe(1);
    expect(state()).toBeUndefined();
    expect(meter.at(-1)).toBe("inactive:delete");
    await host.flush();
    expect(store.transitions.at(-1)).toMatchObject({ fromState: "dozing", toState: "destroyed", reason: "delete" });
    await advance(120_000); // no timer of it is left to fire
    expect(fake.calls.resume).toBe(0);
  });

  it("a drain hibernates a dozing VM with no call open, resuming it first", async () => {
    const { fake, obs, host, store, advance } = setup();
    (await host.acquire(agent, "request")).release();
    obs.waiting(vmId, "bg");
    await advance(200);
    expect(host.status(agent.id)?.state).toBe("dozing");
    store.drainingNow.value = true;
    await host.afterHeartbeat();
    await host.reapIdle();
    await advance(0);
    expect(fake.calls.resume).toBe(1);
    expect(host.status(agent.id)?.state).toBe("hibernated");
  });

  it("shutdown resumes a dozing VM and hibernates it", async () => {
    const { fake, obs, host, advance } = setup();
    (await host.acquire(agent, "request")).release();
    obs.waiting(vmId, "bg");
    await advance(200);
    await host.stop();
    expect(fake.calls.resume).toBe(1);
    expect(fake.calls.hibernate).toBe(1);
    expect(host.status(agent.id)?.state).toBe("hibernated");
  });
});

describe("host doze: races and failures", () => {
  it("an answer that arrives while the pause is in flight waits for the pause, then resumes the VM; one resume for all triggers", async () => {
    const { fake, obs, host, advance, settle, state, moves, meter, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    fake.knobs.pauseGate = gate();
    await advance(200);
    expect(fake.calls.pause).toBe(1);
    expect(state()).toBe("running"); // the pause has not answered
    const answered = obs.answer(vmId, "ex1");
    expect(answered).toBeInstanceOf(Promise);
    const call = host.acquire(agent, "request"); // a second trigger shares the resume
    let written = false;
    void answered!.then(() => (written = true));
    await settle();
    expect(written).toBe(false);
    fake.knobs.pauseGate.open();
    await settle();
    (await call).release();
    expect(written).toBe(true);
    expect(state()).toBe("running");
    expect(fake.calls.resume).toBe(1);
    expect(await moves()).toEqual(["running>dozing:doze", "dozing>running:upstream"]);
    expect(meter).toEqual(["active:request", "doze", "resume"]);
  });

  it("an answer between the decision and the pause (while the driver is asked about CPU) cancels the doze", async () => {
    const { fake, obs, advance, settle, clock, state, callWaitingOnModel } = setup();
    await callWaitingOnModel();
    let release!: () => void;
    const slowCpu = new Promise<void>((r) => (release = r));
    fake.driver.cpuSeconds = async () => {
      await slowCpu;
      return 0;
    };
    clock.advance(200);
    await settle();
    obs.answer(vmId, "ex1");
    release();
    await settle();
    expect(fake.calls.pause).toBe(0);
    await advance(5000);
    expect(state()).toBe("running");
  });

  it("a failed resume ends the VM as a crash: failed, run and meter ended, its process stopped, the answer let go", async () => {
    const { fake, obs, host, store, meter, advance, settle, state, callWaitingOnModel } = setup();
    const ticket = await callWaitingOnModel();
    await advance(200);
    fake.knobs.resumeError = new Error("QMP cont: no answer");
    const answered = obs.answer(vmId, "ex1");
    await expect(answered).resolves.toBeUndefined(); // never rejects: the proxy's connection ends with the VM
    await settle();
    expect(state()).toBe("failed");
    expect(fake.calls.stop).toBe(1);
    expect(meter.at(-1)).toBe("inactive:crash");
    await host.flush();
    const failed = store.transitions.at(-1)!;
    expect(failed).toMatchObject({ fromState: "dozing", toState: "failed", reason: "crash" });
    expect(String(failed.detail?.error)).toMatch(/resume failed: QMP cont/);
    expect([...store.runs.values()].at(-1)?.sleepReason).toBe("crash");
    ticket.release();
    // The next call wakes it again.
    fake.knobs.resumeError = undefined;
    (await host.acquire(agent, "request")).release();
    expect(state()).toBe("running");
  });

  it("a failed pause leaves it running, recorded nowhere but the log, and is not retried at once", async () => {
    const { fake, advance, state, moves, meter, callWaitingOnModel } = setup();
    fake.knobs.pauseError = new Error("QMP stop refused");
    await callWaitingOnModel();
    await advance(200);
    expect(fake.calls.pause).toBe(1);
    expect(state()).toBe("running");
    await advance(5000);
    expect(fake.calls.pause).toBe(1);
    fake.knobs.pauseError = undefined;
    await advance(10_000);
    expect(state()).toBe("dozing");
    expect(await moves()).toEqual(["running>dozing:doze"]);
    expect(meter).toEqual(["active:request", "doze"]);
  });
});
