// Warm templates under Firecracker (common/templates.ts): which template a new VM may be cloned from (its network slot
// must be free), what a template depends on, and the boot that clones one or else boots cold.
//
// Per kind of VM one cold-booted VM is checkpointed; `boot` restores it into the new VM like a fork
// (restoreCheckpoint + wake: fresh identity) and boots cold when that fails. The guest's address is in the template's
// memory, so a clone needs the template's network slot: the first clone takes it and a new template is built (on a
// free slot) in the background; while none is usable, boots are cold.
import { stat } from "node:fs/promises";
import type { Logger } from "../../../lib/log.ts";
import type { VmTemplates } from "../common/templates.ts";
import type { BootResult, VmSpec, WakeResult } from "../driver.ts";
import { readCheckpoint } from "./checkpoint.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import { slotOwner } from "./net.ts";
import { IMAGE_GUEST, type FirecrackerDriverOptions } from "./options.ts";

/** A ready template: its key and its checkpoint directory. */
export interface UsableTemplate {
  key: string;
  dir: string;
}

export interface TemplateBootDeps {
  templates: VmTemplates | undefined;
  log: Logger;
  /** The template a VM like `spec` may be cloned from now (usableTemplate), or undefined. */
  usableTemplate(spec: VmSpec): Promise<UsableTemplate | undefined>;
  restoreCheckpoint(spec: VmSpec, dir: string): Promise<void>;
  wake(spec: VmSpec): Promise<WakeResult>;
  /** Ends what a failed clone left: its process, sockets, partial files. */
  discardClone(spec: VmSpec): Promise<void>;
  coldBoot(spec: VmSpec, started: number): Promise<BootResult>;
}

/**
 * A clone of the template of its kind when one is usable (its wake gives it its identity), else a cold boot. The
 * driver's `boot` after its host check; `started` is when the boot began.
 */
export async function cloneOrBootCold(spec: VmSpec, started: number, deps: TemplateBootDeps): Promise<BootResult> {
  const { log } = deps;
  const template = await deps.usableTemplate(spec).catch((err: unknown) => void log.warn("no template", { vmId: spec.vmId, err }));
  if (template) {
    try {
      await deps.restoreCheckpoint(spec, template.dir);
      const woke = await deps.wake(spec); // a load that fails boots cold there (restore-or-boot.ts)
      const bootMs = performance.now() - started;
      log.info("cloned from a template", { vmId: spec.vmId, template: template.key, mode: woke.mode, fallbackReason: woke.fallbackReason, bootMs: Math.round(bootMs) });
      return { vm: woke.vm, bootMs, ...(woke.mode === "restore" ? { template: template.key } : {}) };
    } catch (err) {
      log.warn("clone from a template failed; booting cold", { vmId: spec.vmId, template: template.key, err });
      await deps.discardClone(spec);
    } finally {
      // This VM holds the template's network slot now (restored or not): the next clone needs a template of its own.
      void deps.templates!.renew(spec).catch((err: unknown) => log.warn("template renewal not started", { vmId: spec.vmId, err }));
    }
  }
  return deps.coldBoot(spec, started);
}

export interface TemplateSlotDeps {
  templates: VmTemplates | undefined;
  opts: Pick<FirecrackerDriverOptions, "jailer" | "network">;
  log: Logger;
}

/**
 * The ready template for VMs like `spec` whose network slot is free (its guest's address is in its memory), or
 * undefined: none yet (one is built in the background), none for a built image outside the jailer, or its slot
 * taken (a new one is built).
 */
export async function usableTemplate(deps: TemplateSlotDeps, spec: VmSpec): Promise<UsableTemplate | undefined> {
  const { templates, opts } = deps;
  if (!templates || (spec.rootImage && !opts.jailer)) return undefined;
  const template = await templates.take(spec);
  if (!template) return undefined;
  const { manifest: c, problem } = await readCheckpoint(template.dir);
  if (!c) throw new Error(`template ${template.key} is unreadable: ${problem ?? "no manifest"}`);
  const holder = await slotOwner(opts.network, c.net.slot);
  if (holder === undefined) return template;
  deps.log.info("template's network slot is taken; booting cold, building a new template", { vmId: spec.vmId, template: template.key, slot: c.net.slot, holder });
  await templates.renew(spec);
  return undefined;
}

export interface TemplateEnvironmentDeps {
  opts: Pick<FirecrackerDriverOptions, "images" | "extraBootArgs" | "jailer" | "diffSnapshots">;
  ready(): Promise<FirecrackerHostFacts>;
}

/** What a template depends on besides the spec: the Firecracker release and host facts, the guest's files, boot arguments. */
export async function templateEnvironment(deps: TemplateEnvironmentDeps, spec: VmSpec): Promise<string> {
  const { opts } = deps;
  const host = await deps.ready();
  const image = await opts.images(spec.rootImage ? IMAGE_GUEST : spec.image);
  const files = await Promise.all(
    [image.kernel, image.initrd, image.rootfs].map(async (path) => {
      if (!path) return null;
      const st = await stat(path);
      return [path, st.size, st.mtimeMs];
    }),
  );
  const { firecrackerVersion, snapshotFormat, cpu, hostKernel } = host;
  return JSON.stringify([firecrackerVersion, snapshotFormat, cpu, hostKernel, files, image.bootArgs ?? null, opts.extraBootArgs ?? null, !!opts.jailer, !!opts.diffSnapshots]);
}
