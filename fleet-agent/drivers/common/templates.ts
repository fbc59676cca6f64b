// Templates, for any driver: per kind of VM (image, memory, vCPUs, egress, and what the guest is made of), one VM booted
// until its workload answers and kept as a checkpoint; a new agent of that kind starts as a clone of it (a restore,
// ~100 ms) instead of a cold boot (seconds under TCG). Built in the background the first time a VM of its kind boots
// cold; rebuilt when what it depends on changes (its key changes), or when the driver says a clone used it up
// (`renew`); listed for the API. The driver gives the boot, checkpoint, destroy and environment (TemplateDeps).
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../../../lib/log.ts";
import { punchZeroPages } from "./zero-holes.ts";
import { commitManifest, readManifest } from "./snapshot-files.ts";
import type { CheckpointInfo, DriverTemplate, RunningVm, VmSpec } from "../driver.ts";

/** A template as the driver lists it: the API's view (contracts/fleet.ts) without the host, with its directory. */
export type TemplateInfo = DriverTemplate & {
  /** The checkpoint directory clones are made from (ready); never leaves the host. */
  dir?: string;
};

/** `<root>/<key>/template.json`: the ready template of a key (replaced by rename when rebuilt). */
interface TemplateRecord {
  key: string;
  image: string;
  memMiB: number;
  vcpus: number;
  allowEgress: boolean;
  dir: string;
  createdAt: string;
  bytes: number;
  bootMs: number;
}

export interface TemplateDeps {
  /** Where templates live (`<data dir>/templates`); not among the VMs' directories. */
  root: string;
  log: Logger;
  /** Cold boot to a workload that answers. */
  boot(spec: VmSpec): Promise<RunningVm>;
  checkpoint(spec: VmSpec, vm: RunningVm, dir: string): Promise<CheckpointInfo>;
  destroy(spec: VmSpec): Promise<void>;
  /** What a template depends on besides the spec (hypervisor version and mode, the guest kernel and initramfs…): the driver's to say. */
  environment(spec: VmSpec): Promise<string>;
}

/** A failed build is tried again after this long (the image may have been fixed, the disk freed). */
const RETRY_AFTER_MS = 60_000;

export class VmTemplates {
  private readonly building = new Map<string, { info: TemplateInfo; done: Promise<void> }>();
  private readonly failed = new Map<string, { info: TemplateInfo; at: number }>();
  /** Renewals whose key is still being worked out (not yet in `building`): `settle` waits for them too. */
  private readonly renewing = new Set<Promise<void>>();

  private readonly deps: TemplateDeps;

  constructor(deps: TemplateDeps) {
    this.deps = deps;
  }

  async key(spec: VmSpec): Promise<string> {
    const env = await this.deps.environment(spec);
    const what = {
      image: spec.image,
      memMiB: spec.memMiB,
      vcpus: spec.vcpus,
      allowEgress: spec.allowEgress,
      diskMiB: spec.rootImage ? (spec.diskMiB ?? null) : null,
      env,
    };
    return createHash("sha256").update(JSON.stringify(what)).digest("hex").slice(0, 16);
  }

  /**
   * The checkpoint directory of the ready template for VMs like `spec`; undefined while there is none, and then
   * one is built in the background (once per key at a time).
   */
  async take(spec: VmSpec): Promise<{ key: string; dir: string } | undefined> {
    const key = await this.key(spec);
    const record = await this.record(key);
    if (record && existsSync(record.dir)) return { key, dir: record.dir };
    this.build(key, spec);
    return undefined;
  }

  /**
   * Builds a new template for VMs like `spec` in the background, the ready one staying listed and cloned until the new
   * one replaces it: for a driver whose clone uses up something of the template (Firecracker: its network slot).
   */
  async renew(spec: VmSpec): Promise<void> {
    const started = this.key(spec).then((key) => this.build(key, spec));
    this.renewing.add(started);
    try {
      await started;
    } finally {
      this.renewing.delete(started);
    }
  }

  /** Builds the template for VMs like `spec` now (unless one is ready) and waits for it. */
  async ensure(spec: VmSpec): Promise<TemplateInfo> {
    const key = await this.key(spec);
    const ready = await this.record(key);
    if (!ready || !existsSync(ready.dir)) {
      this.failed.delete(key);
      this.build(key, spec);
      await this.building.get(key)?.done;
    }
    return (await this.list()).find((t) => t.key === key)!;
  }

  /** Every template: ready ones from disk, builds in flight, recent failures. */
  async list(): Promise<TemplateInfo[]> {
    const out = new Map<string, TemplateInfo>();
    for (const key of await readdir(this.deps.root).catch(() => [] as string[])) {
      const r = await this.record(key);
      if (r)
        out.set(key, {
          key,
          image: r.image,
          memMiB: r.memMiB,
          vcpus: r.vcpus,
          allowEgress: r.allowEgress,
          state: "ready",
          dir: r.dir,
          createdAt: r.createdAt,
          bytes: r.bytes,
          bootMs: r.bootMs,
        });
    }
    for (const [key, b] of this.building) if (!out.has(key)) out.set(key, b.info);
    for (const [key, f] of this.failed) if (!out.has(key)) out.set(key, f.info);
    return [...out.values()].sort((a, b) => a.key.localeCompare(b.key));
  }

  /** Waits for the builds in flight (shutdown, tests). */
  async settle(): Promise<void> {
    await Promise.allSettled([...this.renewing]);
    await Promise.all([...this.building.values()].map((b) => b.done));
  }

  private async record(key: string): Promise<TemplateRecord | undefined> {
    const { manifest } = await readManifest<TemplateRecord>(join(this.deps.root, key, "template.json"), (m) => typeof m.dir === "string");
    return manifest;
  }

  private build(key: string, like: VmSpec): void {
    if (this.building.has(key)) return;
    const failed = this.failed.get(key);
    if (failed && Date.now() - failed.at < RETRY_AFTER_MS) return;
    const info: TemplateInfo = { key, image: like.image, memMiB: like.memMiB, vcpus: like.vcpus, allowEgress: like.allowEgress, state: "building" };
    const done = this.buildNow(key, like).then(
      () => {
        this.failed.delete(key);
      },
      (err: Error) => {
        this.deps.log.error("template build failed", { key, image: like.image, err: err.message });
        this.failed.set(key, { info: { ...info, state: "failed", error: err.message }, at: Date.now() });
      },
    );
    this.building.set(key, { info, done: done.finally(() => this.building.delete(key)) });
  }

  private async buildNow(key: string, like: VmSpec): Promise<void> {
    const home = join(this.deps.root, key);
    await mkdir(home, { recursive: true });
    const spec: VmSpec = { ...like, vmId: `vm_tpl${key}`, agentId: `agt_template${key.slice(0, 8)}`, stateDir: join(home, "vm") };
    await this.deps.destroy(spec); // what an interrupted build left
    const t0 = performance.now();
    const vm = await this.deps.boot(spec);
    const bootMs = Math.round(performance.now() - t0);
    const dir = join(home, `tpl_${key}-${Date.now()}`);
    try {
      const taken = await this.deps.checkpoint(spec, vm, dir);
      // The guest zeroes freed memory (init_on_free=1), so most of a fresh RAM file is zero pages written out: holes
      // instead keep the template (and every reflinked copy of it) to what the guest really holds. Before any clone
      // maps it; a filesystem that cannot punch holes keeps the file as it is. `ram`: QEMU's; `mem`: Firecracker's.
      for (const ram of [join(dir, "ram"), join(dir, "mem")]) {
        if (existsSync(ram))
          await punchZeroPages(ram).catch((err: Error) => this.deps.log.warn("template RAM file kept without holes", { key, err: err.message }));
      }
      const record: TemplateRecord = {
        key,
        image: like.image,
        memMiB: like.memMiB,
        vcpus: like.vcpus,
        allowEgress: like.allowEgress,
        dir,
        createdAt: new Date().toISOString(),
        bytes: taken.bytes,
        bootMs,
      };
      await commitManifest(join(home, "template.json"), record);
      this.deps.log.info("template ready", { key, image: like.image, bootMs, bytes: taken.bytes, copy: taken.copy, pausedMs: Math.round(taken.pausedMs) });
    } finally {
      await this.deps.destroy(spec);
    }
    // Older builds: a clone never needs them again once it ran (its RAM is its own), at worst one boots cold.
    for (const name of await readdir(home))
      if (name.startsWith("tpl_") && join(home, name) !== dir) await rm(join(home, name), { recursive: true, force: true });
  }
}
