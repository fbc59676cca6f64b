// Warm templates under Firecracker (common/templates.ts): which template a new VM may be cloned from (its network slot
// must be free) and what a template depends on; the boot that clones one or else boots cold is common/template-boot.ts.
//
// Per kind of VM one cold-booted VM is checkpointed; `boot` restores it into the new VM like a fork
// (restoreCheckpoint + wake: fresh identity) and boots cold when that fails. The guest's address is in the template's
// memory, so a clone needs the template's network slot: the first clone takes it and a new template is built (on a
// free slot) in the background; while none is usable, boots are cold.
import { stat } from "node:fs/promises";
import type { Logger } from "../../../lib/log.ts";
import type { VmTemplates } from "../common/templates.ts";
import type { TemplateRef } from "../common/template-boot.ts";
import type { VmSpec } from "../driver.ts";
import { readCheckpoint } from "./checkpoint.ts";
import type { FirecrackerHostFacts } from "./host.ts";
import { slotOwner } from "./net.ts";
import { IMAGE_GUEST, type FirecrackerDriverOptions } from "./options.ts";

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
export async function usableTemplate(deps: TemplateSlotDeps, spec: VmSpec): Promise<TemplateRef | undefined> {
  const { templates, opts } = deps;
  if (!templates || (spec.rootImage && !opts.jailer)) return undefined;
  const template = await templates.take(spec);
  if (!template) return undefined;
  const { manifest: c, problem } = await readCheckpoint(template.dir);
  if (!c) throw new Error(`template ${template.key} is unreadable: ${problem ?? "no manifest"}`);
  const holder = await slotOwner(opts.network, c.net.slot);
  if (holder === undefined) return template;
  deps.log.info("template's network slot is taken; booting cold, building a new template", {
    vmId: spec.vmId,
    template: template.key,
    slot: c.net.slot,
    holder,
  });
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
  return JSON.stringify([
    firecrackerVersion,
    snapshotFormat,
    cpu,
    hostKernel,
    files,
    image.bootArgs ?? null,
    opts.extraBootArgs ?? null,
    !!opts.jailer,
    !!opts.diffSnapshots,
  ]);
}
