// Reset standbys on the qemu driver: for a VM that is reset to a checkpoint again and again (an RL episode's end), a
// second QEMU that loaded the checkpoint, ran just long enough to take the VM's identity, clock and exec key, and waits
// stopped with its translated code warm. The next restore of that checkpoint into the VM adopts it as the VM's kept
// paused QEMU (restore.ts: the wake is then a `cont`), instead of a new QEMU loading the files and translating the
// guest's code again: under TCG that first translation is most of a reset's cost.
//
// What it costs: one paused QEMU per VM that was reset (its anonymous memory: QEMU's own and the pages the guest
// dirtied in its short run; the checkpoint's RAM file is page cache it shares), bounded like kept QEMUs (count, time).
// What the adopted VM differs in from a files restore: it ran for the standby's set-up (its identity applied twice,
// its uptime and pid counter a little further on); its memory is otherwise the checkpoint's.
import { createHash, randomBytes } from "node:crypto";
import { link, readFile, rename, rm, stat } from "node:fs/promises";
import { Client } from "undici";
import type { Logger } from "../../../lib/log.ts";
import { encodeSpec, execKeyHeader } from "../../../contracts/exec-wire.ts";
import { cowCopy } from "../common/cow-copy.ts";
import { killLeftover } from "../common/proc.ts";
import { fixGuestClock } from "../common/guest-agent.ts";
import type { VmSpec } from "../driver.ts";
import type { EgressProxy } from "../../egress/proxy.ts";
import { machineArgs, opt, ramIdOf, standbyAdoption, standbyPaths, vmPaths } from "./args.ts";
import { checkpointFiles, readCheckpoint } from "./checkpoint.ts";
import { sendIncoming, waitMigration } from "./migration.ts";
import type { QemuSupervisor } from "./supervisor.ts";
import { execEndpoint, guestHostname, openAgent, waitAgent, type QemuHost, type QemuVm } from "./vm.ts";
import { WaitingPool, type WaitingLimits } from "./waiting.ts";

/** A prepared standby: its QEMU (stopped) and the checkpoint it holds. */
interface Standby {
  vp: QemuVm;
  /** The checkpoint's directory and its state's checksum: a restore of anything else does not adopt it. */
  dir: string;
  sha256: string;
}

export interface StandbyDeps {
  host: QemuHost;
  log: Logger;
  sup: Pick<QemuSupervisor, "launch" | "imageFor" | "waiting">;
  egress: Pick<EgressProxy, "listen">;
  /** How many standbys at once, their memory, and how long one waits for its restore (the kept QEMUs' limits). */
  limits: WaitingLimits;
  /** A standby's bytes for `limits.maxBytes` (as a kept QEMU is weighed: its anonymous memory). */
  weigh: (vp: QemuVm) => number;
  /** How long a standby's load and first answers may take. */
  timeoutMs: number;
}

export class ResetStandbys {
  private readonly deps: StandbyDeps;
  private readonly pool: WaitingPool<Standby>;
  /** A standby being prepared, by vmId: a newer one (or an end) waits for it, and a restore does not find it yet. */
  private readonly preparing = new Map<string, Promise<void>>();

  constructor(deps: StandbyDeps) {
    this.deps = deps;
    this.pool = new WaitingPool<Standby>(
      deps.limits,
      (vmId, s, why) => {
        deps.log.info("reset standby ended", { vmId, why });
        void this.kill(s);
      },
      { weigh: (s) => deps.weigh(s.vp) },
    );
  }

  /**
   * Prepares a standby of checkpoint `dir` for the VM (in the background of a run; what fails is logged: the next
   * restore then loads the files). Only a checkpoint with file-backed RAM: its RAM is shared, never copied.
   */
  prepare(spec: VmSpec, dir: string): Promise<void> {
    const before = this.preparing.get(spec.vmId);
    const work = (async () => {
      await before;
      const have = this.pool.get(spec.vmId);
      const { manifest: c } = await readCheckpoint(dir);
      if (c?.memory !== "file") return;
      if (have && have.dir === dir && have.sha256 === c.sha256 && !have.vp.proc.exit) return;
      await this.endReady(spec.vmId); // (not `end`: that waits for this very preparation)
      const started = performance.now();
      const vp = await this.start(spec, dir, c.sha256, ramIdOf(c.hardware), c.disk);
      this.pool.set(spec.vmId, { vp, dir, sha256: c.sha256 });
      this.deps.log.info("reset standby ready", { vmId: spec.vmId, checkpoint: dir, pid: vp.proc.pid, ms: Math.round(performance.now() - started) });
    })()
      .catch((err: unknown) => this.deps.log.warn("reset standby not prepared: the next reset loads the checkpoint's files", { vmId: spec.vmId, err }))
      .finally(() => {
        if (this.preparing.get(spec.vmId) === work) this.preparing.delete(spec.vmId);
      });
    this.preparing.set(spec.vmId, work);
    return work;
  }

  /**
   * The VM's standby of checkpoint `dir`, taken out (undefined: none, or of another checkpoint, or ended: it is ended).
   * A standby still being prepared is waited for: under way, it is nearer than a new QEMU.
   */
  async take(vmId: string, dir: string): Promise<QemuVm | undefined> {
    await this.preparing.get(vmId);
    const s = this.pool.get(vmId);
    if (!s) return undefined;
    this.pool.delete(vmId);
    const { manifest: c } = await readCheckpoint(dir);
    if (s.dir === dir && c?.sha256 === s.sha256 && !s.vp.proc.exit) return s.vp;
    await this.kill(s);
    return undefined;
  }

  /**
   * Makes an adopted standby the VM's kept paused QEMU for the snapshot the restore just committed (`snapshot`:
   * `<file>:<sha256>`, `templateRam`: the RAM link that snapshot names, the same file the standby maps): its files get
   * the VM's names, its machine arguments the VM's paths, and the egress listener is opened again for it. Its disk
   * stays its own until the wake runs it (restore.ts `pendingDisk`): the files the restore wrote stay a valid snapshot.
   */
  async adopt(spec: VmSpec, vp: QemuVm, snapshot: { pausedAt: string; templateRam: string }): Promise<void> {
    const [mapped, named] = await Promise.all([stat(vp.templateRam!), stat(snapshot.templateRam)]);
    if (mapped.ino !== named.ino || mapped.dev !== named.dev) throw new Error("the standby maps another RAM file than the restored snapshot names");
    for (const [from, to] of standbyAdoption(spec.stateDir, vp.relayed)) await rename(from, to);
    const paths = vmPaths(spec.stateDir);
    await rm(standbyPaths(spec.stateDir).ramLink, { force: true });
    vp.paths = paths;
    vp.templateRam = snapshot.templateRam;
    vp.machineArgs = machineArgs({ ...vp, accel: this.deps.host.accel, egressRelay: this.deps.host.egressRelay });
    if (spec.rootImage) vp.pendingDisk = standbyPaths(spec.stateDir).disk;
    vp.pausedAt = snapshot.pausedAt;
    vp.proc.dropCrashListeners();
    if (this.deps.host.egressRelay !== undefined) await this.deps.egress.listen(spec.vmId, paths.egress, { egress: spec.allowEgress });
    this.deps.sup.waiting.set(spec.vmId, vp);
  }

  /** Ends the VM's standby (its VM stops, is destroyed, or is restored otherwise), after one being prepared. */
  async end(vmId: string): Promise<void> {
    await this.preparing.get(vmId);
    await this.endReady(vmId);
  }

  private async endReady(vmId: string): Promise<void> {
    const s = this.pool.get(vmId);
    if (!s) return;
    this.pool.delete(vmId);
    await this.kill(s);
  }

  /** Every standby ended (the driver closes). */
  async close(): Promise<void> {
    await Promise.all([...this.preparing.values()]);
    await Promise.all(this.pool.keys().map((id) => this.end(id)));
  }

  /**
   * What an earlier process left of the VM's standby (reap at start): its QEMU, if a host killed without the exec stubs'
   * parent-death signal left one running, and its files. A standby of this driver's is left alone.
   */
  async reap(spec: VmSpec): Promise<void> {
    if (this.preparing.has(spec.vmId) || this.pool.has(spec.vmId)) return;
    const paths = standbyPaths(spec.stateDir);
    const killed = await killLeftover(paths.pid, opt(paths.qmp));
    if (killed) this.deps.log.warn("killed a reset standby's QEMU left running by a previous fleet-agent", { vmId: spec.vmId, pid: killed });
    await removeStandbyFiles(spec.stateDir);
  }

  private async kill(s: Standby): Promise<void> {
    await s.vp.proc.kill();
    await removeStandbyFiles(s.vp.spec.stateDir);
  }

  /** The standby's QEMU: loaded from the checkpoint, run for its identity, clock and exec key, stopped. */
  private async start(spec: VmSpec, dir: string, sha256: string, ramId: string, disk: boolean): Promise<QemuVm> {
    const { log, timeoutMs } = this.deps;
    const paths = standbyPaths(spec.stateDir);
    const from = checkpointFiles(dir);
    const state = await readFile(from.state);
    if (createHash("sha256").update(state).digest("hex") !== sha256) throw new Error(`checkpoint ${dir}: its state does not match its checksum`);
    // Its own names for the checkpoint's RAM file and a copy of its disk: the VM's may change under it meanwhile.
    await rm(paths.ramLink, { force: true });
    await link(from.ram, paths.ramLink);
    if (disk) {
      const tmp = `${paths.disk}.tmp-${randomBytes(4).toString("hex")}`;
      await cowCopy(from.disk, tmp);
      await rename(tmp, paths.disk);
    }
    const image = await this.deps.sup.imageFor(spec);
    const vp = await this.deps.sup.launch(spec, image, true, { memory: "file", ramId, templateRam: paths.ramLink }, undefined, { paths });
    try {
      const deadline = performance.now() + timeoutMs;
      await sendIncoming(vp, state, paths.migration);
      const info = await waitMigration(vp, { timeoutMs });
      if (info.status !== "completed") throw new Error(`standby load ${info.status}: ${info["error-desc"] ?? "no detail"}`);
      await openAgent(vp);
      await vp.qmp!.execute("cont");
      const agent = await waitAgent(vp, deadline, "the standby's guest agent did not answer");
      const clonedFrom = dir.split("/").pop()!;
      await agent.identity({ agentId: spec.agentId, hostname: guestHostname(spec.agentId), entropy: randomBytes(32), clonedFrom });
      await fixGuestClock(agent, { sameNetwork: true }); // the checkpoint's guest forwards are every VM's
      vp.execKey = randomBytes(32).toString("hex");
      await agent.execKey(vp.execKey).catch((err: unknown) => log.debug("standby: no exec key pushed (an older guest)", { vmId: spec.vmId, err }));
      vp.execKeyPushed = Promise.resolve();
      await warmExec(vp, log);
      await vp.qmp!.execute("stop");
      return vp;
    } catch (err) {
      await vp.proc.kill();
      throw err;
    }
  }

  /** Whether the VM has a standby ready (tests). */
  has(vmId: string): boolean {
    return this.pool.has(vmId);
  }
}

/** A standby's files (`standbyPaths`), whatever of them exist. */
async function removeStandbyFiles(stateDir: string): Promise<void> {
  const p = standbyPaths(stateDir);
  await Promise.all([p.qmp, p.agent, p.web, p.exec, p.pid, p.port, p.console, p.qemuLog, p.disk, p.ramLink].map((f) => rm(f, { force: true })));
}

/**
 * One `sh -c true` through the guest's exec server, as the first command after a reset is run: its first run after a
 * restore is most of that command's cost under TCG (the guest's fork and exec paths, the shell, translated anew), and
 * it is paid here, before the reset, instead. A guest without an exec server (an older one) just does not warm.
 */
async function warmExec(vp: QemuVm, log: Logger): Promise<void> {
  const ep = execEndpoint(vp); // TCP, or the relayed socket of a QEMU in a namespace of its own
  const client = new Client(`http://${ep.host}:${ep.port}`, ep.socketPath ? { socketPath: ep.socketPath } : {});
  try {
    const res = await client.request({
      path: "/v1/exec",
      method: "POST",
      headers: { [execKeyHeader]: vp.execKey! },
      body: encodeSpec({ argv: ["sh", "-c", "true"] }),
      signal: AbortSignal.timeout(10_000),
    });
    await res.body.arrayBuffer();
  } catch (err) {
    log.debug("standby: the exec server was not warmed", { vmId: vp.spec.vmId, err });
  } finally {
    void client.close().catch(() => undefined);
  }
}
