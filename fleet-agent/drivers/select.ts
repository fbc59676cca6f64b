// Picks the VM driver for this host: DRIVER when set, else qemu where QEMU and the guest image are usable, else process.
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { bool, int, oneOf, type Env } from "../../lib/env.ts";
import type { Logger } from "../../lib/log.ts";
import { customKernelFromEnv, ensureGuestImage } from "../guest/build-image.ts";
import type { DriverName, VmDriver } from "./driver.ts";
import { createFirecrackerDriver } from "./firecracker/config.ts";
import { ProcessDriver, defaultProcessImages } from "./process/driver.ts";
import { DEFAULT_PRESTART_KEEP_MS, DEFAULT_PRESTART_MAX, QemuDriver } from "./qemu/driver.ts";
import { reflinkSupported } from "./common/cow-copy.ts";
import { smallCowExtents } from "./common/cow-extent.ts";
import { parseEgressConfig } from "../egress/config.ts";
import { EgressProxy } from "../egress/proxy.ts";

/** DRIVER: a driver by name, or `auto` (qemu where QEMU and the guest image are usable, else process). */
export type DriverChoice = "auto" | DriverName;

export interface SelectedDriver {
  driver: VmDriver;
  /** Images agents may be created with on this driver. */
  images: string[];
  /** One line for the operator when the choice deserves a word (e.g. no real VMs here). */
  notice: string | undefined;
}

/**
 * Driver-specific variables (read here, at the program's edge, through `env`):
 * | QEMU_ACCEL | auto | kvm, tcg or auto (KVM when /dev/kvm is backed by kvm_intel/kvm_amd) |
 * | QEMU_PRESTART | false | `true`: keep a QEMU waiting in `-incoming defer` per hibernated VM (faster wake, ~30 MB each); `paused` (with QEMU_MEMORY=file): keep the hibernated QEMU itself stopped (~80 MB anonymous + reclaimable RAM-file pages each), a wake of its snapshot is `cont` + clock fix |
 * | QEMU_PRESTART_KEEP_MS | 600000 | ms a kept QEMU (either kind of QEMU_PRESTART) waits for its VM's wake after the hibernation; then it is ended and the wake restores from the files; 0: until the wake |
 * | QEMU_PRESTART_MAX | 16 | the most QEMUs kept waiting at once; the oldest is ended first |
 * | QEMU_MEMORY | stream | stream (all guest RAM into each snapshot) or file (RAM in `<stateDir>/ram`; snapshots hold device state only) |
 * | QEMU_TEMPLATES | false | new agents start as clones of a warm template of their image (`<DATA_DIR>/templates`), built on the first cold boot of each |
 * | GUEST_KERNEL, GUEST_KERNEL_MODULES | Debian's cloud kernel | a kernel of one's own for the guest image |
 * | EGRESS_* | see fleet-agent/egress/config.ts | what the egress proxy of qemu VMs with `allowEgress` lets through |
 * | FIRECRACKER_TEMPLATES | false | new agents start as clones of a warm template of their kind (`<DATA_DIR>/firecracker/templates`), built on the first cold boot of each; a clone takes its template's network slot and a new template is built for the next |
 * | FIRECRACKER_* | see fleet-agent/drivers/firecracker/config.ts | |
 */
export async function selectDriver(choice: DriverChoice, opts: { dataDir: string; log: Logger; env: Env }): Promise<SelectedDriver> {
  const { dataDir, log, env } = opts;
  const image = () => ensureGuestImage({ dataDir, log: (line) => log.info(line), kernel: customKernelFromEnv(env) });

  if (choice === "firecracker") {
    const built = await image();
    if (!built.vmlinux) throw new Error("DRIVER=firecracker needs an uncompressed vmlinux in the guest image; see the README section on Firecracker (GUEST_KERNEL)");
    const driver = createFirecrackerDriver({
      env,
      dataDir,
      images: async (name) => {
        if (name !== "demo") throw new Error(`unknown image "${name}"`);
        return { kernel: built.vmlinux!, initrd: built.initrd };
      },
      logger: log,
      ...(bool(env, "FIRECRACKER_TEMPLATES", false) ? { templates: { root: join(dataDir, "firecracker", "templates") } } : {}),
    });
    await driver.ready(); // refuses, naming what is missing, on a host that cannot run Firecracker
    return { driver, images: ["demo"], notice: undefined };
  }

  const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
  if (choice === "qemu" && !qemuPresent) throw new Error("DRIVER=qemu but qemu-system-x86_64 is not installed: run `npm run setup:vm`");
  if (choice === "qemu" || (choice === "auto" && qemuPresent)) {
    try {
      const built = await image();
      const driver = new QemuDriver({
        image: { kernel: built.kernel, initrd: built.initrd },
        log,
        accel: oneOf(env, "QEMU_ACCEL", ["auto", "kvm", "tcg"] as const, "auto"),
        prestart: prestartMode(env),
        prestartKeepMs: int(env, "QEMU_PRESTART_KEEP_MS", DEFAULT_PRESTART_KEEP_MS, { min: 0 }),
        prestartMax: int(env, "QEMU_PRESTART_MAX", DEFAULT_PRESTART_MAX, { min: 1 }),
        memory: oneOf(env, "QEMU_MEMORY", ["stream", "file"] as const, "stream"),
        egress: new EgressProxy(parseEgressConfig(env), { log }),
        ...(bool(env, "QEMU_TEMPLATES", false) ? { templates: { root: join(dataDir, "templates") } } : {}),
      });
      // Checkpoints and clones copy RAM files and disks: which way is the data directory's filesystem's to decide.
      const reflink = await reflinkSupported(dataDir).catch(() => false);
      log.info(reflink ? "copies of VM files are reflinks (copy-on-write)" : "copies of VM files are full copies (no reflinks on this filesystem)", { dataDir, reflink });
      if (reflink) {
        const cow = await smallCowExtents(dataDir);
        log.info("copy-on-write extent hint for VM files", "set" in cow ? { hint: "4k", directories: cow.set } : { skipped: cow.skipped });
      }
      return { driver, images: ["demo"], notice: undefined };
    } catch (err) {
      if (choice === "qemu") throw err;
      log.warn("qemu present but the guest image could not be built; using the process driver", { err });
    }
  }
  return {
    // The launcher's cache beside the VM directories, not among them (the host would take it for an agent's).
    driver: new ProcessDriver({ logger: log, launcherCacheDir: join(dataDir, "process-launcher") }),
    images: Object.keys(defaultProcessImages),
    notice: "driver: process (workloads run as plain host processes, NOT isolated); for real VMs run `npm run setup:vm`",
  };
}

/** QEMU_PRESTART: `false` (default), `true` (a QEMU waiting in `-incoming defer`) or `paused` (the hibernated QEMU kept stopped). */
function prestartMode(env: Env): boolean | "paused" {
  return env.QEMU_PRESTART?.toLowerCase() === "paused" ? "paused" : bool(env, "QEMU_PRESTART", false);
}
