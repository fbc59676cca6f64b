// A real Firecracker microVM where KVM and the firecracker binary exist: boot → call → hibernate → wake from
// the snapshot → guest clock checked → call again. Firecracker is in neither Debian's nor npm's registry, so on
// machines without it this test is skipped with one line saying what is missing.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { ensureGuestImage } from "../../fleet-agent/guest/build-image.ts";
import { createFirecrackerDriver } from "../../fleet-agent/drivers/firecracker/config.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { kvmUnusable } from "../../fleet-agent/drivers/firecracker/host.ts";

function onPath(cmd: string): string | undefined {
  try {
    return execFileSync("sh", ["-c", `command -v ${cmd}`], { encoding: "utf8" }).trim() || undefined;
  } catch {
    return undefined;
  }
}

const binary = process.env.FIRECRACKER_BIN || onPath("firecracker");
const kvmProblem = await kvmUnusable();
const missing = kvmProblem
  ? `/dev/kvm not usable: ${kvmProblem}`
  : !binary
    ? "no firecracker binary on PATH or in FIRECRACKER_BIN (it is in neither Debian's nor npm's registry)"
    : process.getuid?.() !== 0
      ? "not root (tap devices and nftables rules need CAP_NET_ADMIN)"
      : undefined;
if (missing) console.warn(`firecracker-kvm: real microVM test skipped: ${missing}`);

async function call(vm: RunningVm, path: string, method = "GET"): Promise<Record<string, unknown>> {
  const res = await fetch(`http://${vm.endpoint.host}:${vm.endpoint.port}${path}`, { method, signal: AbortSignal.timeout(10_000) });
  expect(res.status).toBe(200);
  return (await res.json()) as Record<string, unknown>;
}

describe("firecracker on KVM", () => {
  it.skipIf(missing !== undefined)(
    `real microVM: boot → hibernate → wake → clock check → call${missing ? ` (skipped: ${missing})` : ""}`,
    { timeout: 180_000 },
    async () => {
      for (const tool of ["ip", "nft"]) expect(onPath(tool), `${tool} is needed for the tap setup: apt-get install iproute2 nftables`).toBeDefined();
      const dataDir = resolve(process.env.DATA_DIR || join(import.meta.dirname, "../../.data"));
      const image = await ensureGuestImage({ dataDir });
      expect(image.vmlinux, "the guest image has no ELF vmlinux: Firecracker cannot boot the bzImage").toBeDefined();
      const root = mkdtempSync(join(tmpdir(), "fck-"));
      const driver = createFirecrackerDriver({
        env: { ...process.env, FIRECRACKER_BIN: binary, FIRECRACKER_NET_CIDR: "172.30.250.0/24" },
        dataDir: root,
        images: async () => ({ kernel: image.vmlinux!, initrd: image.initrd }),
      });
      const spec: VmSpec = { vmId: "vm_fckvm", agentId: "agt_fckvm", image: "demo", vcpus: 1, memMiB: 256, allowEgress: false, stateDir: join(root, "vm") };
      try {
        const booted = await driver.boot(spec);
        expect(await call(booted.vm, "/")).toEqual({ ok: true, agent: "demo" });
        await call(booted.vm, "/counter", "POST");
        const snap = await driver.hibernate(booted.vm);
        expect(snap.completed).toBe(true);
        await new Promise((r) => setTimeout(r, 5000));
        const woke = await driver.wake(spec);
        expect(woke.fallbackReason).toBeUndefined();
        expect(woke.mode).toBe("restore");
        expect(Math.abs(woke.timings.skewAfterMs)).toBeLessThan(50);
        const guestMs = (await call(woke.vm, "/clock")).nowMs as number;
        expect(Math.abs(guestMs - Date.now())).toBeLessThan(100);
        expect(await call(woke.vm, "/counter")).toEqual({ count: 1 });
        console.log(
          `firecracker on KVM: boot ${Math.round(booted.bootMs)} ms, snapshot ${Math.round(snap.snapshotMs)} ms (${snap.bytes} bytes), ` +
            `restore ${Math.round(woke.timings.restoreMs)} ms, clock fix ${Math.round(woke.timings.clockFixMs)} ms, ` +
            `skew ${Math.round(woke.timings.skewBeforeMs)} → ${woke.timings.skewAfterMs.toFixed(1)} ms`,
        );
      } finally {
        await driver.destroy(spec);
        rmSync(root, { recursive: true, force: true });
      }
    },
  );
});
