// The process driver with templates a test sets: enough to drive the host's, the ingress's and the API's template listing without QEMU.
import type { BootResult, DriverTemplate, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";

/** A template as common/templates.ts lists it: with the host's checkpoint directory, which must never reach the API. */
export type FakeTemplate = DriverTemplate & { dir?: string };

export class FakeTemplateDriver extends ProcessDriver {
  /** What `listTemplates` answers. */
  templates: FakeTemplate[] = [];
  /** When set, a boot says it started as a clone of this template (as QemuDriver.boot does after a restore). */
  cloneOf: string | undefined;
  /** When set, `listTemplates` fails with it (a host whose driver cannot list). */
  listError: Error | undefined;

  async listTemplates(): Promise<DriverTemplate[]> {
    if (this.listError) throw this.listError;
    return this.templates.map((t) => ({ ...t }));
  }

  override async boot(spec: VmSpec): Promise<BootResult> {
    const booted = await super.boot(spec);
    return this.cloneOf ? { ...booted, template: this.cloneOf } : booted;
  }
}

export const readyTemplate: FakeTemplate = {
  key: "0a1b2c3d4e5f6071",
  image: "demo",
  memMiB: 256,
  vcpus: 1,
  allowEgress: false,
  state: "ready",
  dir: "/var/lib/agentvm/templates/0a1b2c3d4e5f6071/tpl_0a1b2c3d4e5f6071-1",
  createdAt: "2026-12-01T10:00:00.000Z",
  bytes: 268_500_000,
  bootMs: 2412,
};

export const failedTemplate: FakeTemplate = {
  key: "ffee000000000001",
  image: "demo",
  memMiB: 512,
  vcpus: 2,
  allowEgress: true,
  state: "failed",
  error: "boot_failed: the workload never answered",
};
