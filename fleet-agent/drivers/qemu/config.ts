// The qemu driver's variables (one zod fragment) and the driver options built from them at the program's edge.
import { z } from "zod";
import { envVar, readBool, vars } from "../../../lib/env.ts";
import { DEFAULT_PRESTART_KEEP_MS, DEFAULT_PRESTART_MAX, type QemuDriverOptions } from "./driver.ts";

export const qemuEnv = z.object({
  QEMU_ACCEL: vars.oneOf(["auto", "kvm", "tcg"] as const, {
    fallback: "auto",
    doc: "`auto`: KVM when `/dev/kvm` is backed by `kvm_intel`/`kvm_amd`, else TCG",
  }),
  QEMU_PRESTART: envVar<boolean | "paused">(
    {
      type: "boolean or `paused`",
      default: "`false`",
      doc: "`true`: keep a QEMU waiting in `-incoming defer` per hibernated VM (faster wake, ≈30 MB each); `paused` (with `QEMU_MEMORY=file`): keep the hibernated QEMU itself stopped (≈80 MB anonymous + reclaimable RAM-file pages each), and a wake of its snapshot is `cont` + the clock fix",
    },
    (raw) => (raw?.toLowerCase() === "paused" ? "paused" : readBool(raw, false)),
  ),
  QEMU_PRESTART_KEEP_MS: vars.int({
    fallback: DEFAULT_PRESTART_KEEP_MS,
    min: 0,
    unit: "ms",
    doc: "how long a kept QEMU (either kind of `QEMU_PRESTART`) waits for its agent's wake after the hibernation; then it is ended and the wake restores from the files; 0: until the wake",
  }),
  QEMU_PRESTART_MAX: vars.int({ fallback: DEFAULT_PRESTART_MAX, min: 1, unit: "QEMUs", doc: "the most QEMUs kept waiting at once; the oldest is ended first" }),
  QEMU_MEMORY: vars.oneOf(["stream", "file"] as const, {
    fallback: "stream",
    doc: "`stream`: all guest RAM into each snapshot; `file`: guest RAM in a file per agent (`<stateDir>/ram`), a hibernation writes only the device state",
  }),
  QEMU_TEMPLATES: vars.bool({
    fallback: false,
    doc: "new agents start as clones of a warm template of their image (`DATA_DIR/templates`), built at the first cold boot of each",
  }),
});

export type QemuSettings = z.output<typeof qemuEnv>;

/** The options of QemuDriver these variables decide (the templates' root is the data directory's, set by the caller). */
export function qemuOptionsOf(v: QemuSettings): Pick<QemuDriverOptions, "accel" | "prestart" | "prestartKeepMs" | "prestartMax" | "memory"> {
  return { accel: v.QEMU_ACCEL, prestart: v.QEMU_PRESTART, prestartKeepMs: v.QEMU_PRESTART_KEEP_MS, prestartMax: v.QEMU_PRESTART_MAX, memory: v.QEMU_MEMORY };
}
