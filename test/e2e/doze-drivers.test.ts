// The drivers' doze (VmDriver.pause/resume) on real VMs and processes: a QEMU VM under TCG waiting on an outbound call
// through the egress proxy is stopped (`query-status` paused, its QEMU spends no CPU, its workload answers nothing)
// while the slow server answers, then runs again: the call completes over the same connection and the guest clock is
// back within 50 ms of the host's; a dozing VM still hibernates, wakes and stops. The process driver's doze stops
// the workload's whole process group and thaws it.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { measureSkewMs } from "../../fleet-agent/drivers/common/guest-agent.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import type { PortEndpoint } from "../../lib/node-net.ts";
import { call, json, makeDriver, makeSpec } from "../helpers/qemu.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const round = (ms: number) => Math.round(ms * 10) / 10;

/**
 * A slow model on the host's loopback: `GET /model/<ms>` answers after <ms> with three chunks 100 ms apart. It records
 * when each request came and was answered, and whether its connection closed before the answer ended.
 */
interface SlowModel {
  port: number;
  server: Server;
  calls: { at: number; answeredAt?: number; endedAt?: number; broke: boolean }[];
}

function slowModel(): Promise<SlowModel> {
  const m: SlowModel = { port: 0, server: undefined as unknown as Server, calls: [] };
  m.server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const ms = Number(/^\/model\/(\d+)$/.exec(req.url ?? "")?.[1] ?? 0);
    const rec: SlowModel["calls"][number] = { at: performance.now(), broke: false };
    m.calls.push(rec);
    res.on("close", () => {
      if (!res.writableFinished) rec.broke = true;
    });
    setTimeout(() => {
      rec.answeredAt = performance.now();
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("first ");
      setTimeout(() => res.write("second "), 100);
      setTimeout(() => {
        res.end("end");
        rec.endedAt = performance.now();
      }, 200);
    }, ms);
  });
  return new Promise((resolve) =>
    m.server.listen(0, "127.0.0.1", () => {
      m.port = (m.server.address() as AddressInfo).port;
      resolve(m);
    }),
  );
}

/** Whether a call to the workload answers within `ms` (false: it timed out). */
async function answersWithin(port: number | PortEndpoint, ms: number): Promise<boolean> {
  try {
    await call(port, "/", { signal: AbortSignal.timeout(ms) });
    return true;
  } catch {
    return false;
  }
}

describe("doze on the qemu driver (TCG)", () => {
  let model: SlowModel;
  let egress: EgressProxy;
  let driver: QemuDriver;
  let spec: VmSpec;
  let vm: RunningVm;

  beforeAll(async () => {
    model = await slowModel();
    // Test-only rules: the one loopback listener is allowed (no internet needed).
    egress = new EgressProxy(parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${model.port}` }));
    driver = await makeDriver({ egress });
    spec = makeSpec({ allowEgress: true });
  });

  afterAll(async () => {
    await driver?.close();
    if (spec) await driver?.destroy(spec);
    model?.server.close();
  });

  it("a VM waiting on an outbound call dozes through the answer: paused, no CPU, no connection broken, the clock fixed", async () => {
    vm = (await driver.boot(spec)).vm;
    const port = vm.endpoint;
    const modelUrl = (ms: number) => `http://127.0.0.1:${model.port}/model/${ms}`;
    // The guest's way out works both ways a client uses the proxy (and the path is warm under TCG).
    for (const via of ["", "&via=connect"]) {
      const warm = await call(port, `/fetch?url=${modelUrl(0)}${via}`);
      expect(warm.status, warm.text).toBe(200);
      expect(warm.text).toBe("first second end");
    }
    const idleCpu0 = await driver.cpuSeconds(vm);
    await sleep(2000);
    const idleCpu = (await driver.cpuSeconds(vm)) - idleCpu0;

    // The agent's call through a CONNECT tunnel (as HTTPS_PROXY is used): the model answers after 3 s.
    const calls = model.calls.length;
    const inbound = call(port, `/fetch?url=${modelUrl(3000)}&via=connect`, { signal: AbortSignal.timeout(60_000) });
    for (let i = 0; i < 200 && model.calls.length === calls; i++) await sleep(25);
    expect(model.calls.length).toBe(calls + 1);
    const outbound = model.calls[calls]!;
    expect(egress.openConnections(spec.vmId)).toBe(1);

    const p0 = performance.now();
    await driver.pause(vm);
    const pauseMs = performance.now() - p0;
    const dozedAt = performance.now();
    expect(await driver.runState(vm)).toBe("paused");
    await driver.pause(vm); // a second pause changes nothing
    const cpu0 = await driver.cpuSeconds(vm);
    // The workload answers nothing while its vCPUs are stopped; the model answers meanwhile (QEMU's user network
    // takes the bytes and keeps them for the guest).
    expect(await answersWithin(port, 1000)).toBe(false);
    expect(await driver.guestLeases(vm)).toBe(0); // as the guest last said, without asking it
    expect(await driver.guestCheckpointRequests(vm)).toEqual([]);
    for (let i = 0; i < 400 && outbound.endedAt === undefined; i++) await sleep(25);
    expect(outbound.endedAt).toBeDefined();
    await sleep(500);
    const dozedCpu = (await driver.cpuSeconds(vm)) - cpu0;
    const dozedMs = performance.now() - dozedAt;
    expect(await driver.runState(vm)).toBe("paused");
    const settled = await Promise.race([inbound.then(() => "answered"), sleep(10).then(() => "pending")]);
    expect(settled).toBe("pending");

    const r0 = performance.now();
    const { clockFixMs } = await driver.resume(vm);
    const resumeMs = performance.now() - r0;
    expect(await driver.runState(vm)).toBe("running");
    const skewMs = await measureSkewMs(driver.guestAgent(vm));
    const answer = await inbound;
    expect(answer.status, answer.text).toBe(200);
    expect(answer.text).toBe("first second end");
    expect(outbound.broke).toBe(false);
    expect(Math.abs(skewMs)).toBeLessThan(50);
    expect(clockFixMs).toBeGreaterThan(0);
    // A stopped TCG guest costs its QEMU (almost) nothing: far less than the same guest idling while it runs.
    expect(dozedCpu).toBeLessThan(Math.max(0.05, idleCpu / 2) * (dozedMs / 2000));
    console.log(
      `qemu doze (${driver.accel}): pause ${round(pauseMs)} ms, resume ${round(resumeMs)} ms (clock fix ${round(clockFixMs)} ms), skew after ${round(skewMs)} ms; ` +
        `QEMU CPU ${round(dozedCpu * 1000)} ms over ${Math.round(dozedMs)} ms dozing vs ${round(idleCpu * 1000)} ms over 2000 ms idle running`,
    );
    expect(await json(port, "/")).toEqual({ ok: true, agent: "demo" });
  }, 240_000);

  it("a dozing VM still hibernates (resumed first, not misread as a kept QEMU), wakes from its snapshot, and stops", async () => {
    expect(vm, "the test above booted it").toBeDefined();
    expect(await json(vm.endpoint, "/counter", { method: "POST" })).toEqual({ count: 1 });
    await driver.pause(vm);
    const snap = await driver.hibernate(vm);
    expect(snap.completed).toBe(true);
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("restore");
    expect(Math.abs(woke.timings.skewAfterMs)).toBeLessThan(50);
    expect(await driver.runState(woke.vm)).toBe("running");
    expect(await json(woke.vm.endpoint, "/counter")).toEqual({ count: 1 });
    await driver.pause(woke.vm);
    expect(await driver.runState(woke.vm)).toBe("paused");
    await driver.stop(woke.vm);
    expect(processAlive(woke.vm.pid!)).toBe(false);
  }, 240_000);
});

describe("doze on the process driver", () => {
  const root = mkdtempSync(join(tmpdir(), "doze-process-"));
  const demo = fileURLToPath(new URL("../../fleet-agent/workloads/demo.ts", import.meta.url));
  // The demo as the child of a shell that waits for it: only a stop of the whole group silences it.
  const driver = new ProcessDriver({ images: { grouped: ["/bin/sh", "-c", `"${process.execPath}" "${demo}" & wait`] } });

  /** Groups of shell workloads: a stop ends the shell only (the driver's rule for commands), the rest is ended here. */
  const groups: number[] = [];
  afterAll(async () => {
    await driver.close();
    for (const pgid of groups) {
      try {
        process.kill(-pgid, "SIGKILL");
      } catch {
        // gone with it
      }
    }
    rmSync(root, { recursive: true, force: true });
  });

  /** The scheduler state of a process (`T`: stopped). */
  const stateOf = (pid: number) => /^\d+ \(.*\) (\S)/.exec(readFileSync(`/proc/${pid}/stat`, "utf8"))![1];
  /** The state once a signal sent to it has been taken (delivery is asynchronous), or after 1 s. */
  const settledStateOf = async (pid: number, want: (s: string) => boolean) => {
    for (let i = 0; i < 100 && !want(stateOf(pid)!); i++) await sleep(10);
    return stateOf(pid);
  };

  it("pause stops the workload's whole group (it answers nothing, spends nothing); resume answers what waited", async () => {
    const spec: VmSpec = {
      vmId: "vm_dozeproc",
      agentId: "agt_dozeproc",
      image: "grouped",
      vcpus: 1,
      memMiB: 128,
      allowEgress: false,
      stateDir: join(root, "a"),
    };
    const { vm } = await driver.boot(spec);
    groups.push(vm.pid!);
    const port = vm.endpoint;
    expect(await json(port, "/")).toEqual({ ok: true, agent: "demo" });
    await driver.pause(vm);
    expect(await settledStateOf(vm.pid!, (s) => s === "T")).toBe("T");
    const cpu0 = await driver.cpuSeconds(vm);
    expect(await answersWithin(port, 1000)).toBe(false);
    // A call made while it dozes waits in the kernel's buffers and is answered after the resume.
    const waiting = json<{ count: number }>(port, "/counter", { method: "POST" });
    await sleep(500);
    expect(await Promise.race([waiting.then(() => "answered"), sleep(10).then(() => "pending")])).toBe("pending");
    expect(await driver.cpuSeconds(vm)).toBe(cpu0);
    expect(await driver.resume(vm)).toEqual({ clockFixMs: 0 });
    expect(await settledStateOf(vm.pid!, (s) => s !== "T")).not.toBe("T");
    expect(await waiting).toEqual({ count: 1 });
    expect(await json(port, "/counter")).toEqual({ count: 1 });
    await driver.stop(vm);
  }, 60_000);

  it("a dozing workload stops like a running one (it runs again to take SIGTERM)", async () => {
    const spec: VmSpec = { vmId: "vm_dozestop", agentId: "agt_dozestop", image: "demo", vcpus: 1, memMiB: 128, allowEgress: false, stateDir: join(root, "b") };
    const { vm } = await driver.boot(spec);
    await driver.pause(vm);
    expect(await settledStateOf(vm.pid!, (s) => s === "T")).toBe("T");
    const t0 = performance.now();
    await driver.stop(vm);
    expect(processAlive(vm.pid!)).toBe(false);
    expect(performance.now() - t0).toBeLessThan(1500); // SIGTERM taken, not the 2 s grace's SIGKILL
  }, 60_000);
});
