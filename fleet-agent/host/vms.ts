// The host's VM entries, one per agent it has heard of: made on first sight, looked up by agent id, counted for the heartbeat and the gauges.
import { join } from "node:path";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { type AgentSpec, type VmState, vmIdFor } from "../../contracts/agent.ts";
import { isImageDigest, type ImageArtifact, type ImageLocator } from "../../contracts/image.ts";
import type { VmSpec } from "../drivers/driver.ts";
import type { HostFs } from "../host-fs.ts";
import { newVmEntry, type VmEntry } from "../vm-entry.ts";

export interface VmTableDeps {
  hostId: string;
  /** Root of this host's VM state directories (`<dir>/<agentId>`). */
  vmsDir: string;
  fs: HostFs;
  clock: Clock;
  /** Where built images' files are on this host (agents whose `image` is a digest). */
  images?: ImageLocator;
  /** The image, fetched from the shared store when this host lacks it (images/build/host-images.ts); absent: no store. */
  fetchImage?(digest: string): Promise<ImageArtifact | undefined>;
}

export class VmTable {
  private readonly vms = new Map<string, VmEntry>();
  private readonly deps: VmTableDeps;

  constructor(deps: VmTableDeps) {
    this.deps = deps;
  }

  get(agentId: string): VmEntry | undefined {
    return this.vms.get(agentId);
  }

  has(agentId: string): boolean {
    return this.vms.has(agentId);
  }

  /** Forgets a VM (deleted, or evicted: another host owns it now). */
  delete(agentId: string): void {
    this.vms.delete(agentId);
  }

  ids(): IterableIterator<string> {
    return this.vms.keys();
  }

  values(): IterableIterator<VmEntry> {
    return this.vms.values();
  }

  /** The agent's entry, made on first sight; a known one takes the spec the call carries. */
  entryFor(spec: AgentSpec): VmEntry {
    let e = this.vms.get(spec.id);
    if (e) {
      e.spec = spec; // idle timeouts and limits may have changed; the VM's shape changes on its next boot
      // Egress may change while the VM sleeps (PATCH): its next start opens the way out, or not, as the agent now says.
      if (!e.running) e.vmSpec.allowEgress = spec.allowEgress;
      return e;
    }
    const stateDir = join(this.deps.vmsDir, spec.id);
    const vmSpec: VmSpec = {
      vmId: vmIdFor(spec.id),
      agentId: spec.id,
      image: spec.image,
      vcpus: spec.vcpus,
      memMiB: spec.memMiB,
      allowEgress: spec.allowEgress,
      stateDir,
      ...(spec.diskMiB !== undefined ? { diskMiB: spec.diskMiB } : {}),
      ...(spec.desktop ? { desktop: spec.desktop } : {}),
    };
    // A directory left by an earlier host process may hold a snapshot: wake tries it, else boots.
    const state = this.deps.fs.hasStateDir(stateDir) ? "stopped" : "creating";
    e = newVmEntry(spec, vmSpec, state, this.deps.clock.monotonic());
    this.vms.set(spec.id, e);
    return e;
  }

  /** The spec of an agent known only by its directory: enough for what a driver finds by it (leftover processes, the log). */
  bareSpec(agentId: string): VmSpec {
    return { vmId: vmIdFor(agentId), agentId, image: "", vcpus: 0, memMiB: 0, allowEgress: false, stateDir: join(this.deps.vmsDir, agentId) };
  }

  /**
   * A built image's files, looked up when the VM needs them (and again while they are missing). With `fetchImage` (a
   * shared store) every use asks it: it fetches an image this host lacks or removed since, and marks it used.
   */
  async attachImage(entry: VmEntry): Promise<void> {
    const { image } = entry.vmSpec;
    if (!isImageDigest(image) || (entry.vmSpec.rootImage && !this.deps.fetchImage)) return;
    const artifact = this.deps.fetchImage ? await this.deps.fetchImage(image) : this.deps.images?.(image);
    if (!artifact)
      throw new AppError("boot_failed", `image ${image} is not on host ${this.deps.hostId}${this.deps.fetchImage ? " nor in the artifact store" : ""}`);
    entry.vmSpec.rootImage = artifact;
  }

  /** The built images the VMs awake here run (a dozing or snapshotting VM's included): what a trim of images keeps. */
  imagesAwake(): Set<string> {
    const digests = new Set<string>();
    for (const e of this.vms.values()) if (e.running && isImageDigest(e.vmSpec.image)) digests.add(e.vmSpec.image);
    return digests;
  }

  /** Open tickets over every VM: the requests in flight on this host. */
  inFlight(): number {
    let n = 0;
    for (const e of this.vms.values()) n += e.tickets.length;
    return n;
  }

  count(inState: (state: VmState) => boolean): number {
    let n = 0;
    for (const e of this.vms.values()) if (inState(e.state)) n++;
    return n;
  }

  /** The entry of the VM with this id (`vmIdFor`'s inverse), if this host has one. */
  byVmId(vmId: string): VmEntry | undefined {
    const e = vmId.startsWith("vm_") ? this.vms.get(`agt_${vmId.slice(3)}`) : undefined;
    return e?.vmSpec.vmId === vmId ? e : undefined;
  }

  /**
   * Memory of the VMs awake here (booting, running, dozing, restoring, snapshotting) and how many they are: what the
   * heartbeat reports. A dozing VM's memory is still held (its process and RAM stay), so it counts.
   */
  load(): { usedMiB: number; awakeAgents: number } {
    let usedMiB = 0;
    let awakeAgents = 0;
    for (const e of this.vms.values()) {
      if (e.state !== "booting" && e.state !== "running" && e.state !== "dozing" && e.state !== "restoring" && e.state !== "snapshotting") continue;
      usedMiB += e.vmSpec.memMiB;
      awakeAgents++;
    }
    return { usedMiB, awakeAgents };
  }
}
