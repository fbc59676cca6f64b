// bench:doze with doze off or on: a whole system on the qemu driver, its agents booted and warmed, one inbound call each (many model calls), and what it cost.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inArray } from "drizzle-orm";
import { parseAllInOneConfig, startAllInOne, type System } from "../../../compose/all-in-one.ts";
import { fixGuestClock, measureSkewMs } from "../../../fleet-agent/drivers/common/guest-agent.ts";
import type { RunningVm } from "../../../fleet-agent/drivers/driver.ts";
import { QemuDriver } from "../../../fleet-agent/drivers/qemu/driver.ts";
import { parseEgressConfig } from "../../../fleet-agent/egress/config.ts";
import { LateExchangeObserver } from "../../../fleet-agent/egress/exchanges.ts";
import { EgressProxy } from "../../../fleet-agent/egress/proxy.ts";
import type { GuestImage } from "../../../fleet-agent/guest/build-image.ts";
import { AppError } from "../../../lib/errors.ts";
import { silentLogger } from "../../../lib/log.ts";
import { vmEvents } from "../../../schema/core.ts";
import { percentile, round } from "../figures.ts";
import { SlowModel } from "../slow-model.ts";
import { billedOver, meteredUntil } from "./billed.ts";
import { CpuSampler, type CpuShare } from "./cpu.ts";

export interface DozeBench {
  image: GuestImage;
  accel: "auto" | "kvm" | "tcg";
  /** Agents to run (`--agents`); fewer when the machine cannot boot them all. */
  agents: number;
  /** Model calls per inbound call (`--calls`). */
  calls: number;
  /** `via=connect` (a CONNECT tunnel, as HTTPS_PROXY is used) or plain HTTP through the proxy. */
  via: "connect" | "plain";
  model: SlowModel;
  say(line: string): void;
  /** Registers what ends the mode's system (its VMs with it), for an interrupt; unregisters with `undefined`. */
  onInterrupt(cleanup: (() => Promise<void>) | undefined): void;
}

/** What the demo agent's `/fetch?…&times=N` answers (fleet-agent/guest/demo-agent/fetch.c). */
interface FetchSummary {
  ok: number;
  calls: { status?: number; fnv?: string; firstByteAt?: number; error?: string }[];
}

export interface ModeResult {
  doze: boolean;
  agents: number;
  /** Why fewer agents than asked ran, if so. */
  stoppedBecause?: string;
  bootMsP50: number;
  /** Inbound calls answered 200 with every model call 200 and received whole. */
  callsOk: number;
  modelCalls: number;
  /** Model calls whose connection the client closed before the answer ended (a broken connection). */
  closedEarly: number;
  /** Each inbound call's wall time, s: mean, and p50. */
  wallS: { mean: number; p50: number };
  /** Billed active and dozing seconds of the inbound calls (meter segments, clipped to each call's window), summed over agents. */
  billedActiveS: number;
  billedDozingS: number;
  /** Guest wall clock at the first byte's receipt minus the model's wall clock at its first write, ms, per model call. */
  firstByteToGuestMs: { p50: number; p99: number; max: number; min: number; n: number };
  /** |guest clock − host clock| after the calls, ms (each was set right before them; with doze, at each resume too). */
  skewAfterMs: { p50: number; max: number };
  dozes: number;
  resumes: Record<string, number>;
  /**
   * How long the host took to run a dozing VM again on an answer (`cont` + the clock fix: the event log's `resumeMs`),
   * ms: how long the egress proxy held the answer's first byte.
   */
  upstreamResumeMs: { p50: number; p99: number; max: number; n: number } | null;
  cpuAllWaiting: CpuShare;
  cpuAllDozing: CpuShare;
  mostDozing: number;
  machine: { load1Max: number; availableMiBMin: number };
}

const r1 = (x: number) => round(x, 1);

/** Boots up to `wanted` agents one after another (each answers `/` and warms its way out); stops at the first that fails. */
async function bootAgents(run: DozeBench, system: System, headers: Record<string, string>, wanted: number) {
  const ids: string[] = [];
  const bootMs: number[] = [];
  let stoppedBecause: string | undefined;
  const warmUrl = run.model.url(SlowModel.path({ firstByteMs: 0, tokens: 2, gapMs: 5 }));
  for (let i = 0; i < wanted; i++) {
    const t0 = performance.now();
    try {
      const created = await fetch(`${system.url}/v1/agents`, {
        method: "POST",
        headers,
        body: JSON.stringify({ allowEgress: true, idleTimeoutMs: 3_600_000 }),
      });
      if (created.status !== 201) throw new AppError("internal", `create: ${created.status} ${await created.text()}`);
      const { id } = (await created.json()) as { id: string };
      ids.push(id);
      const first = await fetch(`${system.url}/a/${id}/`, { headers, signal: AbortSignal.timeout(120_000) });
      if (first.status !== 200) throw new AppError("internal", `first call: ${first.status} ${await first.text()}`);
      bootMs.push(performance.now() - t0);
      // The way out warmed (a first exchange's code is cold under TCG), the way the calls go.
      const warm = await fetch(`${system.url}/a/${id}/fetch?url=${warmUrl}${run.via === "connect" ? "&via=connect" : ""}`, {
        headers,
        signal: AbortSignal.timeout(60_000),
      });
      if (warm.status !== 200) throw new AppError("internal", `warm call: ${warm.status} ${await warm.text()}`);
    } catch (err) {
      stoppedBecause = `agent ${i + 1} failed after ${Math.round(performance.now() - t0)} ms: ${(err as Error).message}`;
      if (ids.length > bootMs.length) ids.pop();
      break;
    }
    run.say(`agent ${i + 1}/${wanted} up in ${Math.round(bootMs.at(-1)!)} ms`);
  }
  if (stoppedBecause) run.say(`stopped booting at ${ids.length}/${wanted}: ${stoppedBecause}`);
  return { ids, bootMs, stoppedBecause };
}

export async function runMode(run: DozeBench, doze: boolean, wanted: number): Promise<ModeResult> {
  const { model, say } = run;
  const tag = doze ? "doze on" : "doze off";
  const sayMode = (line: string) => say(`${tag}: ${line}`);
  const dataDir = mkdtempSync(join(tmpdir(), "bench-doze-"));
  const exchanges = new LateExchangeObserver();
  const egress = new EgressProxy(parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${model.port}` }), { exchanges });
  const driver = new QemuDriver({ image: run.image, accel: run.accel, egress, log: silentLogger });
  const env: Record<string, string> = {
    PORT: "0",
    DATA_DIR: dataDir,
    REAPER_INTERVAL_MS: "1000",
    DOZE_AFTER_MS: doze ? "200" : "0",
  };
  const system = await startAllInOne(parseAllInOneConfig(env, ["demo"]), { driver, log: silentLogger, exchanges });
  const headers = { authorization: `Bearer ${system.demo.token}`, "content-type": "application/json" };
  const db = system.database.db;
  let ids: string[] = [];
  let ended: Promise<void> | undefined;
  const end = () =>
    (ended ??= (async () => {
      // Deleted, not hibernated: nothing to snapshot at the end.
      for (const id of ids) await fetch(`${system.url}/v1/agents/${id}`, { method: "DELETE", headers }).catch(() => undefined);
      await system.stop();
      await driver.close();
      rmSync(dataDir, { recursive: true, force: true });
    })());
  run.onInterrupt(end);
  try {
    const booted = await bootAgents({ ...run, say: sayMode }, system, headers, wanted);
    ids = booted.ids;
    if (ids.length === 0) throw new AppError("internal", `no agent could run: ${booted.stoppedBecause}`);
    const n = ids.length;
    const vms = ids.map((id) => ({ spec: { vmId: system.host.status(id)!.vmId } }) as RunningVm);
    await new Promise((r) => setTimeout(r, 3000)); // the boots' load settles
    // Every guest clock set right before the calls, in both modes: with doze off nothing sets it again, so the first
    // byte's time to the guest is measured against a clock as fresh as a resume leaves it (its skew after: below).
    for (const vm of vms) await fixGuestClock(driver.guestAgent(vm));
    const modelBefore = model.calls.length;
    const sampler = new CpuSampler(
      {
        qemuSeconds: async () => (await Promise.all(vms.map((vm) => driver.cpuSeconds(vm)))).reduce((a, b) => a + b, 0),
        waitingCalls: () => model.calls.filter((c, i) => i >= modelBefore && c.firstByteAt === undefined && !c.closedEarly).length,
        dozingVms: () => ids.filter((id) => system.host.status(id)?.state === "dozing").length,
      },
      250,
    );
    sayMode(`${n} inbound calls at once, each making ${run.calls} model calls (${run.via})`);
    const url = `${model.url()}${run.via === "connect" ? "&via=connect" : ""}&times=${run.calls}`;
    let finished = 0;
    const answers = await Promise.all(
      ids.map(async (id) => {
        const from = Date.now();
        const res = await fetch(`${system.url}/a/${id}/fetch?url=${url}`, { headers, signal: AbortSignal.timeout(3_600_000) });
        const text = await res.text();
        const to = Date.now();
        sayMode(`call ${++finished}/${n} answered ${res.status} in ${r1((to - from) / 1000)} s`);
        return { id, from, to, status: res.status, text };
      }),
    );
    await sampler.stop();
    const skewAfter = await Promise.all(vms.map((vm) => measureSkewMs(driver.guestAgent(vm)).catch(() => NaN)));
    const skews = skewAfter.filter(Number.isFinite).map(Math.abs);

    // What came back, matched with what the model sent (each answer's FNV-1a names its call).
    const made = model.calls.slice(modelBefore);
    const byFnv = new Map(made.map((c) => [c.fnv, c]));
    const firstByteToGuest: number[] = [];
    let callsOk = 0;
    for (const a of answers) {
      if (a.status !== 200) continue;
      const summary = JSON.parse(a.text) as FetchSummary;
      let whole = summary.ok === run.calls;
      for (const c of summary.calls) {
        const sent = c.fnv === undefined ? undefined : byFnv.get(c.fnv);
        if (!sent || c.firstByteAt === undefined || sent.firstByteWallMs === undefined) whole = false;
        else firstByteToGuest.push(c.firstByteAt - sent.firstByteWallMs);
      }
      if (whole) callsOk++;
    }
    const wall = answers.map((a) => (a.to - a.from) / 1000);

    // Billed: the meter's segments over each call's window, once billing has them past the last call's end.
    const lastEnd = Math.max(...answers.map((a) => a.to));
    const waitUntil = Date.now() + 60_000; // a heartbeat (10 s by default) and a shipment
    while ((await meteredUntil(db, ids)) < lastEnd && Date.now() < waitUntil) await new Promise((r) => setTimeout(r, 500));
    let billedActiveMs = 0;
    let billedDozingMs = 0;
    for (const a of answers) {
      const b = await billedOver(db, [a.id], a.from, a.to);
      billedActiveMs += b.activeMs;
      billedDozingMs += b.dozingMs;
    }
    await system.host.flush();
    const events = await db
      .select({ fromState: vmEvents.fromState, toState: vmEvents.toState, reason: vmEvents.reason, detail: vmEvents.detail })
      .from(vmEvents)
      .where(inArray(vmEvents.agentId, ids));
    const resumes: Record<string, number> = {};
    const resumeMs: number[] = [];
    for (const e of events) {
      if (e.fromState !== "dozing") continue;
      resumes[e.reason] = (resumes[e.reason] ?? 0) + 1;
      const ms = e.detail?.resumeMs;
      if (e.reason === "upstream" && typeof ms === "number") resumeMs.push(ms);
    }

    const result: ModeResult = {
      doze,
      agents: n,
      ...(booted.stoppedBecause ? { stoppedBecause: booted.stoppedBecause } : {}),
      bootMsP50: Math.round(percentile(booted.bootMs, 50)),
      callsOk,
      modelCalls: made.length,
      closedEarly: made.filter((c) => c.closedEarly).length,
      wallS: { mean: r1(wall.reduce((s, x) => s + x, 0) / wall.length), p50: r1(percentile(wall, 50)) },
      billedActiveS: r1(billedActiveMs / 1000),
      billedDozingS: r1(billedDozingMs / 1000),
      firstByteToGuestMs: {
        p50: r1(percentile(firstByteToGuest, 50)),
        p99: r1(percentile(firstByteToGuest, 99)),
        max: r1(Math.max(...firstByteToGuest)),
        min: r1(Math.min(...firstByteToGuest)),
        n: firstByteToGuest.length,
      },
      skewAfterMs: { p50: r1(percentile(skews, 50)), max: r1(Math.max(...skews)) },
      dozes: events.filter((e) => e.toState === "dozing").length,
      resumes,
      upstreamResumeMs: resumeMs.length
        ? { p50: r1(percentile(resumeMs, 50)), p99: r1(percentile(resumeMs, 99)), max: r1(Math.max(...resumeMs)), n: resumeMs.length }
        : null,
      cpuAllWaiting: sampler.allWaiting(n),
      cpuAllDozing: sampler.allDozing(n),
      mostDozing: sampler.mostDozing(),
      machine: sampler.machine(),
    };
    sayMode(JSON.stringify(result));
    return result;
  } finally {
    await end();
    run.onInterrupt(undefined);
  }
}
