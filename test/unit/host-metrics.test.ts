// What the host core counts (fake driver with known timings, hand-driven clock, a real prom-client registry): wakes by
// mode and reason with their phases, the queue and first byte of each call, snapshots' bytes, failures, VM gauges.
import { describe, expect, it } from "vitest";
import { ManualClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import { createNodeMetrics } from "../../lib/node-metrics.ts";
import { Host } from "../../fleet-agent/host.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import type { RunningVm, VmDriver, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";

const MiB = 1024 * 1024;
const spec = (id: string): AgentSpec => ({
  id,
  tenantId: "ten_m",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 60_000,
  streamIdleMs: 60_000,
  allowEgress: false,
});

function setup() {
  const clock = new ManualClock();
  const failBoot = { next: false };
  const vm = (s: VmSpec): RunningVm => ({ spec: s, endpoint: { host: "127.0.0.1", port: 9 }, pid: 42 });
  const driver: VmDriver = {
    name: "qemu",
    isolated: true,
    logPath: (s) => `${s.stateDir}/console.log`,
    boot: async (s) => {
      clock.advance(1200);
      if (failBoot.next) throw new AppError("boot_failed", "entrypoint exited");
      return { vm: vm(s), bootMs: 1200 };
    },
    hibernate: async () => ({ completed: true, snapshotMs: 80, bytes: 60 * MiB }),
    wake: async (s) => {
      clock.advance(40);
      return { vm: vm(s), mode: "restore", timings: { restoreMs: 37, clockFixMs: 3, skewBeforeMs: 9000, skewAfterMs: 1 } };
    },
    stop: async () => {},
    destroy: async () => {},
    cpuSeconds: async () => 0,
    guestLeases: async () => 0,
    onExit: () => {},
    reap: async () => {},
    close: async () => {},
  };
  const metrics = createNodeMetrics({ processMetrics: false });
  const host = new Host({
    config: {
      hostId: "host_m",
      vmsDir: "/nonexistent/agentvm-metrics-test",
      wakeQueueLimit: 10,
      wakeDeadlineMs: 60_000,
      reaperIntervalMs: 100,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
    },
    driver,
    store: createMemoryHostStore(),
    clock,
    log: silentLogger,
    activity: { active: () => {}, inactive: () => {} },
    metrics,
  });
  const scrape = async () => {
    const text = await metrics.metricsText();
    return (series: string): number | undefined => {
      const line = text.split("\n").find((l) => l.startsWith(`${series} `));
      return line === undefined ? undefined : Number(line.slice(series.length + 1));
    };
  };
  return { host, clock, scrape, failBoot };
}

describe("host metrics", () => {
  it("a boot, a hibernation and a restore: counts, phases, first byte, snapshot bytes and the VM gauges", async () => {
    const { host, clock, scrape } = setup();
    const a = spec("agt_metrics01");

    // Two calls wait for the same boot: one wake, two queue observations.
    const [t1, t2] = await Promise.all([host.acquire(a, "request"), host.acquire(a, "request")]);
    clock.advance(5);
    t1.firstByte();
    t2.firstByte(); // the run's first byte is recorded once
    t1.release();
    t2.release();
    let m = await scrape();
    expect(m('agentvm_wakes_total{mode="boot",reason="request"}')).toBe(1);
    expect(m('agentvm_wake_seconds_count{mode="boot"}')).toBe(1);
    expect(m('agentvm_wake_seconds_sum{mode="boot"}')).toBeCloseTo(1.2);
    expect(m("agentvm_wake_boot_seconds_count")).toBe(1);
    expect(m("agentvm_wake_boot_seconds_sum")).toBeCloseTo(1.2);
    expect(m("agentvm_wake_restore_seconds_count")).toBe(0);
    expect(m('agentvm_wake_queue_seconds_count{mode="boot"}')).toBe(2);
    expect(m('agentvm_wake_first_byte_seconds_count{mode="boot"}')).toBe(1);
    expect(m('agentvm_wake_first_byte_seconds_sum{mode="boot"}')).toBeCloseTo(1.205);
    expect(m("agentvm_vms_awake")).toBe(1);
    expect(m("agentvm_vms_hibernated")).toBe(0);

    // A warm call is not a wake.
    const warm = await host.acquire(a, "request");
    warm.firstByte();
    warm.release();
    expect((await scrape())('agentvm_wakes_total{mode="boot",reason="request"}')).toBe(1);

    await host.hibernateNow(a.id);
    m = await scrape();
    expect(m("agentvm_snapshot_bytes_total")).toBe(60 * MiB);
    expect(m('agentvm_snapshot_seconds_count{reason="api"}')).toBe(1);
    expect(m('agentvm_snapshot_seconds_sum{reason="api"}')).toBeCloseTo(0.08);
    expect(m("agentvm_vms_awake")).toBe(0);
    expect(m("agentvm_vms_hibernated")).toBe(1);

    await host.wake(a, "webhook");
    m = await scrape();
    expect(m('agentvm_wakes_total{mode="restore",reason="webhook"}')).toBe(1);
    expect(m("agentvm_wake_restore_seconds_count")).toBe(1);
    expect(m("agentvm_wake_restore_seconds_sum")).toBeCloseTo(0.037);
    expect(m("agentvm_wake_clock_fix_seconds_sum")).toBeCloseTo(0.003);
    expect(m('agentvm_wake_seconds_count{mode="restore"}')).toBe(1);
    expect(m("agentvm_vms_awake")).toBe(1);
    expect(m("agentvm_vms_hibernated")).toBe(0);

    // A stopped host leaves the gauges: it holds no VMs any more.
    await host.stop();
    m = await scrape();
    expect(m("agentvm_vms_awake")).toBe(0);
    expect(m("agentvm_snapshot_bytes_total")).toBe(120 * MiB);
  });

  it("a failed boot is counted by reason and code, not as a wake", async () => {
    const { host, scrape, failBoot } = setup();
    failBoot.next = true;
    await expect(host.acquire(spec("agt_metrics02"), "api")).rejects.toMatchObject({ code: "boot_failed" });
    const m = await scrape();
    expect(m('agentvm_wake_failures_total{reason="api",code="boot_failed"}')).toBe(1);
    expect(m('agentvm_wakes_total{mode="boot",reason="api"}')).toBeUndefined();
    expect(m("agentvm_vms_awake")).toBe(0);
  });
});
