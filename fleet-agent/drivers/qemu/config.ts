// The qemu driver's variables (one zod fragment) and the driver options built from them at the program's edge.
import { totalmem } from "node:os";
import { z } from "zod";
import { envVar, readBool, vars } from "../../../lib/env.ts";
import { DEFAULT_PRESTART_KEEP_MS, DEFAULT_PRESTART_MAX, type QemuDriverOptions } from "./driver.ts";
import { TCG_TB_MIB } from "./args.ts";

export const qemuEnv = z.object({
  QEMU_ACCEL: vars.oneOf(["auto", "kvm", "tcg"] as const, {
    fallback: "auto",
    doc: "`auto`: KVM when `/dev/kvm` is backed by `kvm_intel`/`kvm_amd`, else TCG",
  }),
  QEMU_PRESTART: envVar<boolean | "paused">(
    {
      type: "boolean or `paused`",
      default: "`paused`",
      doc: "`paused` (file-backed RAM; otherwise as `true`): keep the hibernated QEMU itself stopped, and a wake of its snapshot is `cont` + the clock fix; `true`: keep a QEMU waiting in `-incoming defer` per hibernated VM; `false`: a wake starts its QEMU. Kept QEMUs are bounded by `QEMU_PRESTART_MEMORY_MIB`, `QEMU_PRESTART_MAX` and `QEMU_PRESTART_KEEP_MS`; beyond them agents sleep as files",
    },
    (raw) => (raw === undefined || raw === "" || raw.toLowerCase() === "paused" ? "paused" : readBool(raw, false)),
  ),
  QEMU_PRESTART_MEMORY_MIB: vars.int({
    fallback: defaultKeptMemoryMiB(),
    min: 0,
    unit: "MiB",
    default: "1/8 of the host's memory",
    doc: "the memory kept QEMUs may hold together (their anonymous resident memory, measured when kept: a paused one ≈ 40-80 MB under TCG); the least recently hibernated goes first, and its agent sleeps as files; 0: none kept",
  }),
  QEMU_PRESTART_KEEP_MS: vars.int({
    fallback: DEFAULT_PRESTART_KEEP_MS,
    min: 0,
    unit: "ms",
    doc: "how long a kept QEMU (either kind of `QEMU_PRESTART`) waits for its agent's wake after the hibernation; then it is ended and the wake restores from the files; 0: until the wake",
  }),
  QEMU_PRESTART_MAX: vars.int({
    fallback: DEFAULT_PRESTART_MAX,
    min: 1,
    unit: "QEMUs",
    doc: "the most QEMUs kept waiting at once; the oldest is ended first. Reset standbys (a second QEMU kept for an agent that is reset to a checkpoint again and again) are bounded by this, `QEMU_PRESTART_MEMORY_MIB` and `QEMU_PRESTART_KEEP_MS` too, counted apart",
  }),
  QEMU_TCG_TB_MIB: vars.int({
    fallback: TCG_TB_MIB,
    min: 1,
    unit: "MiB",
    doc: "TCG's translated-code cache per QEMU (`-accel tcg,tb-size`; no effect under KVM): most of a kept QEMU's memory once its guest has run a while (QEMU flushes the cache when it fills, and translates again what runs next). Changing it keeps every snapshot",
  }),
  QEMU_MEMORY: vars.oneOf(["auto", "stream", "file"] as const, {
    fallback: "auto",
    doc: "`file`: guest RAM in a file per agent (`<stateDir>/ram`), reserved while it runs and sparse while it sleeps; a hibernation writes only the device state; `stream`: all guest RAM into each snapshot; `auto`: `file` where the data directory's filesystem can reserve and punch a file's blocks (probed and logged at start), else `stream`. A change wakes every agent from the snapshot it has and converts it",
  }),
  QEMU_TEMPLATES: vars.bool({
    fallback: true,
    doc: "new agents start as clones of a warm template of their image (`DATA_DIR/templates`), built at the first cold boot of each",
  }),
});

export type QemuSettings = z.output<typeof qemuEnv>;

/** The default budget of kept QEMUs: an eighth of the host's memory. */
function defaultKeptMemoryMiB(): number {
  return Math.floor(totalmem() / 8 / 2 ** 20);
}

/**
 * The options of QemuDriver these variables decide; `memory` is `QEMU_MEMORY` with `auto` resolved by the caller (it
 * probes the data directory: ram-space.ts `probeRamSpace`), the templates' root is the data directory's.
 */
export function qemuOptionsOf(
  v: QemuSettings,
  memory: "stream" | "file",
): Pick<QemuDriverOptions, "accel" | "prestart" | "prestartKeepMs" | "prestartMax" | "prestartMemoryBytes" | "tcgTbMiB" | "memory"> {
  return {
    accel: v.QEMU_ACCEL,
    prestart: v.QEMU_PRESTART,
    prestartKeepMs: v.QEMU_PRESTART_KEEP_MS,
    prestartMax: v.QEMU_PRESTART_MAX,
    prestartMemoryBytes: v.QEMU_PRESTART_MEMORY_MIB * 2 ** 20,
    tcgTbMiB: v.QEMU_TCG_TB_MIB,
    memory,
  };
}
