// The idle reaper alone: the CPU-fraction rule, what one pass does with a VM, and how passes are scheduled.
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger, type Logger } from "../../lib/log.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { CpuWindow } from "../../fleet-agent/cpu-window.ts";
import { IdleReaper } from "../../fleet-agent/reaper.ts";
import { newVmEntry, type VmEntry } from "../../fleet-agent/vm-entry.ts";

describe("CPU window", () => {
  it("is a rate: CPU seconds used per wall second between the last two samples", () => {
    const w = new CpuWindow();
    w.sample(0, 10);
    expect(w.fraction).toBeUndefined(); // one sample says nothing
    w.sample(2000, 11);
    expect(w.fraction).toBe(0.5);
    w.sample(3000, 11);
    expect(w.fraction).toBe(0);
  });

  it("keeps the last fraction when two samples share an instant, and starts over after reset", () => {
    const w = new CpuWindow();
    w.sample(0, 0);
    w.sample(1000, 0.3);
    w.sample(1000, 5);
    expect(w.fraction).toBeCloseTo(0.3);
    w.reset();
    expect(w.fraction).toBeUndefined();
    w.sample(2000, 0); // a new run's counter: not compared with the sample before the reset
    expect(w.fraction).toBeUndefined();
  });
});

const agent: AgentSpec = { id: "agt_r", tenantId: "ten_a", image: "demo", vcpus: 1, memMiB: 256, idleTimeoutMs: 5000, streamIdleMs: 2000, allowEgress: false };
const vmSpec: VmSpec = { vmId: "vm_r", agentId: "agt_r", image: "demo", vcpus: 1, memMiB: 256, allowEgress: false, stateDir: "/nonexistent/vm_r" };

function setup(opts: { log?: Logger } = {}) {
  const clock = new ManualClock();
  const entry: VmEntry = newVmEntry(agent, vmSpec, "running", clock.monotonic());
  entry.running = { spec: vmSpec, endpoint: { host: "127.0.0.1", port: 1 }, pid: 1 };
  const driver = {
    cpu: 0,
    guestLeases: async () => 0,
    cpuSeconds: async () => driver.cpu,
  };
  const hibernated: VmEntry[] = [];
  let passes = 0;
  let broken = false;
  const reaper = new IdleReaper({
    clock,
    driver,
    log: opts.log ?? silentLogger,
    intervalMs: 100,
    cpuBusyThreshold: 0.2,
    vms: () => {
      passes++;
      if (broken) throw new Error("registry broken");
      return [entry];
    },
    hibernate: (e) => void hibernated.push(e),
  });
  return { clock, entry, driver, hibernated, reaper, passes: () => passes, breakRegistry: () => void (broken = true) };
}

const turn = () => new Promise((r) => setImmediate(r));

describe("idle reaper pass", () => {
  it("a guest CPU at or above the threshold is work: it restarts the idle timeout; below it the VM is let go", async () => {
    const { clock, entry, driver, hibernated, reaper } = setup();
    await reaper.pass(); // first sample at 0
    clock.advance(4000);
    driver.cpu = 0.8; // 0.8 s over 4 s = 0.2, exactly the threshold
    await reaper.pass();
    expect(entry.lastActivityAt).toBe(4000);
    clock.advance(4000);
    driver.cpu = 1.4; // 0.6 s over 4 s = 0.15: quiet, but 4 s since the work < 5 s idle timeout
    await reaper.pass();
    expect(hibernated).toEqual([]);
    expect(entry.lastActivityAt).toBe(4000);
    clock.advance(1000);
    await reaper.pass();
    expect(hibernated).toEqual([entry]);
  });

  it("leaves alone a VM that began to hibernate while the driver was asked about it", async () => {
    const { clock, entry, driver, hibernated, reaper } = setup();
    clock.advance(10_000);
    driver.cpuSeconds = async () => {
      entry.hibernation = { promise: Promise.resolve(), abort: new AbortController() };
      return 0;
    };
    await reaper.pass();
    expect(hibernated).toEqual([]);
    expect(entry.cpu.fraction).toBeUndefined();
  });
});

describe("idle reaper schedule", () => {
  it("runs a pass every interval on the injected clock until stopped; a driver error does not fail a pass", async () => {
    const errors: string[] = [];
    const { clock, driver, reaper, passes } = setup({ log: { ...silentLogger, error: (msg) => void errors.push(msg) } });
    driver.guestLeases = async () => {
      throw new Error("guest agent gone"); // a driver error counts as no guest lease, not as a failed pass
    };
    reaper.start();
    clock.advance(99);
    expect(passes()).toBe(0);
    clock.advance(1);
    await turn();
    expect(passes()).toBe(1);
    clock.advance(100);
    await turn();
    expect(passes()).toBe(2);
    expect(errors).toEqual([]);
    await reaper.stop();
    clock.advance(1000);
    await turn();
    expect(passes()).toBe(2);
  });

  it("logs a pass that throws and schedules the next one", async () => {
    const errors: string[] = [];
    const { clock, reaper, passes, breakRegistry } = setup({ log: { ...silentLogger, error: (msg) => void errors.push(msg) } });
    breakRegistry();
    reaper.start();
    clock.advance(100);
    await turn();
    clock.advance(100);
    await turn();
    expect(passes()).toBe(2);
    expect(errors).toEqual(["idle reaper failed", "idle reaper failed"]);
    await reaper.stop();
  });
});
