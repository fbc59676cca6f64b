// The guest kernel's variables (one zod fragment): a kernel of one's own instead of Debian's cloud kernel. (Not in build-image.ts: that file's text is part of the guest image's cache key.)
import { resolve } from "node:path";
import { z } from "zod";
import { vars } from "../../lib/env.ts";
import type { CustomKernel } from "./build-image.ts";

export const guestKernelEnv = z.object({
  GUEST_KERNEL: vars.optStr({
    type: "path",
    default: "(unset: Debian's cloud kernel)",
    doc: "build the guest image around this kernel (ELF vmlinux or bzImage) of your own",
  }),
  GUEST_KERNEL_MODULES: vars.optStr({
    type: "path",
    default: "(unset)",
    doc: "`lib/modules/<release>` of `GUEST_KERNEL`, when it has the virtio drivers as modules",
  }),
});

export type GuestKernelSettings = z.output<typeof guestKernelEnv>;

export function customKernelOf(v: GuestKernelSettings): CustomKernel | undefined {
  if (!v.GUEST_KERNEL) return undefined;
  return { path: resolve(v.GUEST_KERNEL), ...(v.GUEST_KERNEL_MODULES ? { modulesDir: resolve(v.GUEST_KERNEL_MODULES) } : {}) };
}
