// `npm start`'s step before it picks a driver: plans the VM path (vm-path-plan.ts), installs what is missing with apt and builds the guest image, saying each step and the time it took.
import { performance } from "node:perf_hooks";
import type { DriverChoice } from "../fleet-agent/drivers/select.ts";
import { ensureGuestImage, type CustomKernel, type GuestImage } from "../fleet-agent/guest/build-image.ts";
import { aptInstall, isDebian, missingVmPackages, qemuInstalled } from "./setup-vm.ts";
import { fallbackLine, planVmPath, type MachineFacts, type VmPathPlan } from "./vm-path-plan.ts";

export interface VmPathOptions {
  dataDir: string;
  kernel?: CustomKernel;
  /** Where the progress lines go (`npm start`: the terminal). */
  say: (line: string) => void;
  /** The machine as it is; tests give their own. */
  probe?: () => MachineFacts;
  /** Installs Debian packages; true when it worked (default: apt-get, scripts/setup-vm.ts). */
  install?: (packages: string[], log: (line: string) => void) => boolean;
  now?: () => number;
}

export interface VmPathReady {
  /** The driver to select: DRIVER as given, or `process` when the VM path could not be had. */
  driver: DriverChoice;
  /** The guest image, made sure of here (selectDriver need not look again). */
  image?: GuestImage;
  /** The one line that says why agents run as processes and what to run, when they do for want of QEMU. */
  notice?: string;
  plan: VmPathPlan;
}

/** This machine's facts, probed with a few short commands (command -v, dpkg-query). */
export function machineFacts(): MachineFacts {
  return { qemu: qemuInstalled(), missingPackages: missingVmPackages(), root: process.getuid?.() === 0, apt: isDebian() };
}

export async function prepareVmPath(choice: DriverChoice, opts: VmPathOptions): Promise<VmPathReady> {
  const now = opts.now ?? (() => performance.now());
  const say = (line: string) => opts.say(`vm path: ${line}`);
  const started = now();
  const plan = planVmPath(choice, opts.probe ?? machineFacts);
  if (plan.kind === "skip") return { driver: choice, plan };
  if (plan.kind === "fail") throw new Error(plan.reason);
  if (plan.kind === "fallback") return { driver: "process", notice: plan.reason, plan };

  // Refuses DRIVER=qemu; under auto, agents run as processes with one line saying why.
  const cannot = (why: string): VmPathReady => {
    if (choice === "qemu") throw new Error(`DRIVER=qemu but ${why}`);
    return { driver: "process", notice: fallbackLine(why, "run `npm run setup:vm` to see what is missing"), plan };
  };
  if (plan.kind === "provision") {
    const installed = (opts.install ?? aptInstall)(plan.install, say);
    if (!installed && !(opts.probe ?? machineFacts)().qemu) return cannot(`installing ${plan.install.join(", ")} with apt-get failed`);
  }
  try {
    const image = await ensureGuestImage({ dataDir: opts.dataDir, log: say, ...(opts.kernel ? { kernel: opts.kernel } : {}) });
    opts.say(`VM path ready in ${((now() - started) / 1000).toFixed(1)} s`);
    return { driver: choice, image, plan };
  } catch (err) {
    return cannot(`the guest image could not be built (${(err as Error).message.split("\n")[0]})`);
  }
}
