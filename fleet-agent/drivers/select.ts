// Picks the VM driver for this host (DRIVER when set, else qemu where QEMU and the guest image are usable, else process) and builds it from the drivers' parsed variables.
import { join } from "node:path";
import { spawnSync } from "node:child_process";
import { z } from "zod";
import type { Logger } from "../../lib/log.ts";
import { ensureGuestImage, type GuestImage } from "../guest/build-image.ts";
import { customKernelOf, guestKernelEnv } from "../guest/kernel-env.ts";
import type { DriverName, VmDriver } from "./driver.ts";
import { createFirecrackerDriver, firecrackerEnv } from "./firecracker/config.ts";
import { ProcessDriver, defaultProcessImages } from "./process/driver.ts";
import { QemuDriver } from "./qemu/driver.ts";
import { qemuEnv, qemuOptionsOf } from "./qemu/config.ts";
import { ramFileUnfit } from "./qemu/ram-space.ts";
import { reflinkSupported } from "./common/cow-copy.ts";
import { smallCowExtents } from "./common/cow-extent.ts";
import { egressConfigOf, egressEnv } from "../egress/config.ts";
import { EgressProxy } from "../egress/proxy.ts";
import { UpstreamSlot, type DestinationCheck } from "../egress/upstreams.ts";
import type { UpstreamConfig } from "../egress/config.ts";
import { LateExchangeObserver } from "../egress/exchanges.ts";

/** DRIVER: a driver by name, or `auto` (qemu where QEMU and the guest image are usable, else process). */
export type DriverChoice = "auto" | DriverName;

/** A driver's upstream path (its egress proxy's), bound once the host exists, and the proxy's destination check (async calls are made outside a VM's connection). */
export interface DriverUpstreams {
  slot: UpstreamSlot;
  config: UpstreamConfig;
  destination: DestinationCheck;
}

export interface SelectedDriver {
  driver: VmDriver;
  /** Images agents may be created with on this driver. */
  images: string[];
  /** One line for the operator when the choice deserves a word (e.g. no real VMs here). */
  notice: string | undefined;
  /**
   * The driver's upstream path (the qemu driver's egress proxy), bound once the host exists (fleet-agent/upstreams/serve.ts);
   * none: this driver's VMs reach no upstreams (process, Firecracker).
   */
  upstreams?: DriverUpstreams;
  /** What the driver's egress proxy tells about the VMs' outbound exchanges: bound to the host once it is built (its doze). */
  exchanges: LateExchangeObserver;
}

/** Every driver's variables: the qemu driver's, Firecracker's, the egress proxy's (qemu VMs that allow egress), the guest kernel's. */
export const driversEnv = z.object({ ...qemuEnv.shape, ...firecrackerEnv.shape, ...egressEnv.shape, ...guestKernelEnv.shape });

export type DriverSettings = z.output<typeof driversEnv>;

/** `image`: the guest image when the caller has made sure of it already (`npm start`: scripts/vm-path.ts); else it is built or found here. */
export async function selectDriver(
  choice: DriverChoice,
  opts: { dataDir: string; log: Logger; settings: DriverSettings; image?: GuestImage },
): Promise<SelectedDriver> {
  const { dataDir, log, settings } = opts;
  const exchanges = new LateExchangeObserver();
  const image = async () => opts.image ?? (await ensureGuestImage({ dataDir, log: (line) => log.info(line), kernel: customKernelOf(settings) }));

  if (choice === "firecracker") {
    const built = await image();
    if (!built.vmlinux)
      throw new Error("DRIVER=firecracker needs an uncompressed vmlinux in the guest image; see the README section on Firecracker (GUEST_KERNEL)");
    const reflink = await copiesOfVmFiles(dataDir, log);
    if (settings.FIRECRACKER_DIFF === "auto")
      log.info(
        reflink
          ? "diff snapshots after the first restore (FIRECRACKER_DIFF=auto)"
          : "full snapshots: no reflinks to copy memory files with (FIRECRACKER_DIFF=auto)",
        { dataDir },
      );
    const driver = createFirecrackerDriver({
      reflink,
      settings,
      dataDir,
      images: async (name) => {
        if (name !== "demo") throw new Error(`unknown image "${name}"`);
        return { kernel: built.vmlinux!, initrd: built.initrd };
      },
      logger: log,
      egressRules: egressConfigOf(settings).rules,
      ...(settings.FIRECRACKER_TEMPLATES ? { templates: { root: join(dataDir, "firecracker", "templates") } } : {}),
    });
    await driver.ready(); // refuses, naming what is missing, on a host that cannot run Firecracker
    return { driver, images: ["demo"], notice: undefined, exchanges };
  }

  const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
  if (choice === "qemu" && !qemuPresent) throw new Error("DRIVER=qemu but qemu-system-x86_64 is not installed: run `npm run setup:vm`");
  if (choice === "qemu" || (choice === "auto" && qemuPresent)) {
    try {
      const built = await image();
      const egressConfig = egressConfigOf(settings);
      const slot = new UpstreamSlot();
      const egress = new EgressProxy(egressConfig, { log, upstreams: slot, exchanges });
      const upstreams: DriverUpstreams = { slot, config: egressConfig.upstreams, destination: (host, port) => egress.destination(host, port) };
      const driver = new QemuDriver({
        image: { kernel: built.kernel, initrd: built.initrd },
        log,
        ...qemuOptionsOf(settings, await memoryMode(settings.QEMU_MEMORY, dataDir, log)),
        egress,
        ...(settings.QEMU_TEMPLATES ? { templates: { root: join(dataDir, "templates") } } : {}),
      });
      await copiesOfVmFiles(dataDir, log);
      return { driver, images: ["demo"], notice: undefined, upstreams, exchanges };
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
    exchanges,
  };
}

/**
 * Checkpoints, clones and diff snapshots copy RAM files, memory files and disks: which way is the data directory's
 * filesystem's to decide (probed, said in one line); where it reflinks, the copy-on-write extent hint is set too.
 */
async function copiesOfVmFiles(dataDir: string, log: Logger): Promise<boolean> {
  const reflink = await reflinkSupported(dataDir).catch(() => false);
  log.info(reflink ? "copies of VM files are reflinks (copy-on-write)" : "copies of VM files are full copies (no reflinks on this filesystem)", {
    dataDir,
    reflink,
  });
  if (reflink) {
    const cow = await smallCowExtents(dataDir);
    log.info("copy-on-write extent hint for VM files", "set" in cow ? { hint: "4k", directories: cow.set } : { skipped: cow.skipped });
  }
  return reflink;
}

/**
 * QEMU_MEMORY resolved: `auto` is file-backed RAM where the data directory's filesystem can reserve and punch a RAM
 * file's blocks (ram-space.ts), else streamed; said in one line either way, as the copies' reflinks are.
 */
async function memoryMode(setting: "auto" | "stream" | "file", dataDir: string, log: Logger): Promise<"stream" | "file"> {
  if (setting !== "auto") return setting;
  const unfit = await ramFileUnfit(dataDir);
  if (unfit) log.warn("guest RAM is streamed into each snapshot (QEMU_MEMORY=auto): this filesystem cannot keep RAM files", { dataDir, why: unfit });
  else log.info("guest RAM lives in a file per agent (QEMU_MEMORY=auto)", { dataDir });
  return unfit ? "stream" : "file";
}
