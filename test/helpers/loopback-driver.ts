// A fake VmDriver for host tests over real sockets: every VM is one HTTP server on loopback (the port asked for when a
// VM starts), booting and waking at once; what a test needs beyond that (pause, execTarget, stop) it passes in.
import type { RunningVm, VmDriver, VmSpec } from "../../fleet-agent/drivers/driver.ts";

export function loopbackDriver(port: () => number, extra: Partial<VmDriver> = {}): VmDriver {
  const vm = (spec: VmSpec): RunningVm => ({ spec, endpoint: { host: "127.0.0.1", port: port() }, pid: 1 });
  return {
    name: "qemu",
    isolated: true,
    logPath: (spec) => `${spec.stateDir}/console.log`,
    boot: async (spec) => ({ vm: vm(spec), bootMs: 1 }),
    wake: async (spec) => ({ vm: vm(spec), mode: "restore", timings: { restoreMs: 1, clockFixMs: 0, skewBeforeMs: 0, skewAfterMs: 0 } }),
    hibernate: async () => ({ completed: true, snapshotMs: 1, bytes: 1 }),
    stop: async () => {},
    destroy: async () => {},
    cpuSeconds: async () => 0,
    guestLeases: async () => 0,
    onExit: () => {},
    reap: async () => {},
    close: async () => {},
    ...extra,
  };
}
