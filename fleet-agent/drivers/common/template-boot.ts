// `VmDriver.boot` with templates, for any driver: a clone of the template of the VM's kind when one is ready (made a
// hibernated VM, then woken: the wake gives it its identity), else, or when the clone fails, a cold boot.
import type { Logger } from "../../../lib/log.ts";
import type { BootResult, VmSpec, WakeResult } from "../driver.ts";

/** A ready template (common/templates.ts `take`): its key and the checkpoint directory clones are made from. */
export interface TemplateRef {
  key: string;
  dir: string;
}

export interface TemplateBootSteps {
  spec: VmSpec;
  log: Logger;
  /** performance.now() when the boot began: `bootMs` counts from it. */
  started: number;
  /** The template to clone, or undefined (none ready or usable: boot cold). A rejection is logged and boots cold. */
  take(): Promise<TemplateRef | undefined>;
  /** Makes the VM's stateDir a hibernated clone of the template (the driver's `restoreCheckpoint`). */
  clone(template: TemplateRef): Promise<void>;
  /** Wakes the clone; a load that fails boots cold there (restore-or-boot.ts), reported by its `mode`. */
  wake(): Promise<WakeResult>;
  /** After a clone or its wake threw: removes what it left (a process, partial files) before the cold boot. */
  discard(): Promise<void>;
  /**
   * Once a taken template was tried, whatever came of it (after `discard` when it failed), before the answer or the
   * cold boot. Firecracker: the clone holds the template's network slot now, so a new template is built.
   */
  afterClone?(template: TemplateRef): void;
  /** The cold boot; its result is the boot's when no clone ran. */
  coldBoot(): Promise<BootResult>;
}

/**
 * A clone of the template of its kind when one is ready, else a cold boot. `template` is reported only when the clone
 * was restored (not when its wake fell back to a boot); a clone that fails is logged and the VM boots cold.
 */
export async function bootFromTemplate(s: TemplateBootSteps): Promise<BootResult> {
  const { spec, log } = s;
  const template = await s.take().catch((err: unknown) => void log.warn("no template", { vmId: spec.vmId, err }));
  if (template) {
    try {
      await s.clone(template);
      const woke = await s.wake();
      const bootMs = performance.now() - s.started;
      log.info("cloned from a template", {
        vmId: spec.vmId,
        template: template.key,
        mode: woke.mode,
        fallbackReason: woke.fallbackReason,
        bootMs: Math.round(bootMs),
      });
      return { vm: woke.vm, bootMs, ...(woke.mode === "restore" ? { template: template.key } : {}) };
    } catch (err) {
      log.warn("clone from a template failed; booting cold", { vmId: spec.vmId, template: template.key, err });
      await s.discard();
    } finally {
      s.afterClone?.(template);
    }
  }
  return s.coldBoot();
}
