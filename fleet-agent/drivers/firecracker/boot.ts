// Cold boot of a Firecracker VM: its network slot and tap, a new process configured through the API (machine, kernel
// and initramfs, a built image's drives, eth0, vsock), InstanceStart, then the guest agent and the workload answer.
import { copyFile, chown, link, mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { beginDiskGeneration } from "../common/agent-disk.ts";
import { ConsoleWatch, outOfMemoryHint, waitImageReady } from "../common/image-boot.ts";
import { waitForHttp } from "../common/readiness.ts";
import { withLogTail } from "../common/vm-process.ts";
import type { BootResult, VmSpec } from "../driver.ts";
import { imageDrives } from "./image-drives.ts";
import { prepareImageFiles, stageDrives } from "./image-files.ts";
import { claimNet, kernelIpArg, runNetScript, type NetOptions, type VmNet } from "./net.ts";
import { BASE_BOOT_ARGS, GUEST_CID, IMAGE_GUEST, type FirecrackerDriverOptions, type JailerOptions } from "./options.ts";
import type { VmPaths } from "./paths.ts";
import type { FirecrackerProcesses } from "./supervisor.ts";
import { waitForGuestAgent } from "./vsock.ts";

export interface BootDeps {
  opts: Pick<FirecrackerDriverOptions, "images" | "network" | "jailer" | "diffSnapshots" | "extraBootArgs" | "bootTimeoutMs">;
  log: Logger;
  agentPort: number;
  vms: Pick<FirecrackerProcesses, "paths" | "spawn" | "kill">;
  /** The host check (common to every phase; cached once it passes). */
  ready(): Promise<unknown>;
}

/** Boots the VM from its kernel (no template). */
export async function coldBoot(deps: BootDeps, spec: VmSpec, started: number): Promise<BootResult> {
  const { opts, vms } = deps;
  await deps.ready();
  const image = await opts.images(spec.rootImage ? IMAGE_GUEST : spec.image);
  if (spec.rootImage && image.rootfs)
    throw new Error(`guest image "${IMAGE_GUEST}" has a root drive: a built image needs the initramfs as the root (its init mounts the image)`);
  const net = await prepareNet(opts.network, spec);
  // A built image's disk (made on its first boot) starts a new generation: no earlier snapshot pairs with it now.
  const files = spec.rootImage ? await prepareImageFiles(spec, "boot", deps.log) : undefined;
  if (files) await beginDiskGeneration(files.disk);
  // The init's lines on the console (an entrypoint that exited, a drive that would not mount) end the wait at once.
  const consoleWatch = files ? new ConsoleWatch(vms.paths(spec).log) : undefined;
  const live = await vms.spawn(spec, net);
  const { api, paths } = live;
  try {
    await api.putMachineConfig({
      vcpu_count: spec.vcpus,
      mem_size_mib: spec.memMiB,
      smt: false,
      ...(opts.diffSnapshots ? { track_dirty_pages: true } : {}),
    });
    const bootArgs = [BASE_BOOT_ARGS, kernelIpArg(net), image.bootArgs, opts.extraBootArgs].filter(Boolean).join(" ");
    const kernel = await visible(opts.jailer, paths, image.kernel, "vmlinux");
    const initrd = image.initrd ? await visible(opts.jailer, paths, image.initrd, "initrd") : undefined;
    await api.putBootSource({ kernel_image_path: kernel, ...(initrd ? { initrd_path: initrd } : {}), boot_args: bootArgs });
    if (image.rootfs)
      await api.putDrive({
        drive_id: "rootfs",
        is_root_device: true,
        path_on_host: await visible(opts.jailer, paths, image.rootfs, "rootfs"),
        is_read_only: true,
      });
    if (files) {
      live.drives = imageDrives(await stageDrives(spec, paths, files, opts.jailer));
      for (const drive of live.drives) await api.putDrive(drive);
    }
    await api.putNetworkInterface({ iface_id: "eth0", host_dev_name: net.tap, guest_mac: net.mac });
    await api.putVsock({ guest_cid: GUEST_CID, uds_path: paths.vm(paths.vsock) });
    await api.action("InstanceStart");
    const config = await api.vmConfig();
    const mc = config["machine-config"];
    if (mc && (mc.vcpu_count !== spec.vcpus || mc.mem_size_mib !== spec.memMiB)) {
      throw new Error(`firecracker reports ${mc.vcpu_count} vCPU / ${mc.mem_size_mib} MiB, asked for ${spec.vcpus} / ${spec.memMiB}`);
    }
    const deadline = started + (opts.bootTimeoutMs ?? 30_000);
    const gaveUp = () => {
      const said = consoleWatch?.failure();
      return said ? `the image's ${said}` : live.proc.exitedWhy("firecracker");
    };
    live.agent = await waitForGuestAgent(paths.vsock, deps.agentPort, { deadlineMs: deadline - performance.now(), gaveUp });
    const agent = live.agent;
    if (spec.rootImage) await waitImageReady(live.vm.endpoint, spec.rootImage.config, { deadline, gaveUp, listening: (port, ms) => agent.listening(port, ms) });
    else await waitForHttp(live.vm.endpoint, { deadline, gaveUp });
  } catch (err) {
    await vms.kill(live);
    if (consoleWatch) {
      // What the init said is the reason, whichever wait noticed it first.
      const said = consoleWatch.failure();
      const reason = said ? `the image's ${said}` : (err as Error).message;
      const tail = consoleWatch.tail();
      throw new AppError(
        "boot_failed",
        `agent ${spec.agentId} did not boot: ${outOfMemoryHint(consoleWatch, spec.memMiB)}${reason}${tail ? ` (console: ${tail})` : ""}`,
        {
          cause: err,
        },
      );
    }
    throw withLogTail(new Error(`firecracker boot of ${spec.vmId} failed: ${(err as Error).message}`, { cause: err }), paths.log, "firecracker log");
  }
  deps.log.info("firecracker vm booted", {
    vmId: spec.vmId,
    pid: live.vm.pid,
    ...(spec.rootImage ? { image: spec.rootImage.digest } : {}),
    bootMs: Math.round(performance.now() - started),
  });
  return { vm: live.vm, bootMs: performance.now() - started };
}

/** The VM's network slot (claimed, or the one it keeps) and its tap, made by the setup script when there is one. */
export async function prepareNet(network: NetOptions, spec: Pick<VmSpec, "vmId" | "stateDir" | "allowEgress">): Promise<VmNet> {
  await mkdir(spec.stateDir, { recursive: true });
  const net = await claimNet(network, spec.stateDir, spec.vmId);
  if (network.setupScript) {
    await runNetScript(network.setupScript, "up", net, { allowEgress: spec.allowEgress, uplink: network.uplink, egress: network.egress });
  }
  return net;
}

/** A file the Firecracker process must open: under the jailer it is linked (or copied) into the chroot. */
async function visible(jailer: JailerOptions | undefined, paths: VmPaths, hostPath: string, name: string): Promise<string> {
  if (!jailer) return hostPath;
  const inside = join(paths.root, name);
  await rm(inside, { force: true });
  await link(hostPath, inside).catch(() => copyFile(hostPath, inside));
  await chown(inside, jailer.uid, jailer.gid);
  return paths.vm(inside);
}
