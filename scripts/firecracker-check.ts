// Host readiness check for DRIVER=firecracker: /dev/kvm, the firecracker binary and its snapshot format, the
// guest kernel (an ELF vmlinux), and the tools the tap setup needs. `npm run firecracker:check`; exit 1 = not ready.
// The check itself is `checkFirecrackerHost` (also what the driver runs before its first VM).
import { execFileSync } from "node:child_process";
import { existsSync, openSync, readSync, closeSync } from "node:fs";
import { join, resolve } from "node:path";
import { firecrackerBinary } from "../fleet-agent/drivers/firecracker/config.ts";
import { checkFirecrackerHost, describeCpu, FirecrackerHostError } from "../fleet-agent/drivers/firecracker/host.ts";

export { checkFirecrackerHost, FirecrackerHostError } from "../fleet-agent/drivers/firecracker/host.ts";

/** Why `path` cannot be Firecracker's x86_64 kernel (it boots an uncompressed ELF vmlinux), or undefined. */
export function kernelProblem(path: string): string | undefined {
  if (!existsSync(path)) return `guest kernel ${path} not found: run \`npm run setup:vm\` (it extracts vmlinux from Debian's cloud kernel)`;
  const fd = openSync(path, "r");
  const head = Buffer.alloc(4);
  readSync(fd, head, 0, 4, 0);
  closeSync(fd);
  if (!head.equals(Buffer.from([0x7f, 0x45, 0x4c, 0x46])))
    return `${path} is not an ELF vmlinux (a compressed bzImage?): Firecracker needs the uncompressed kernel`;
  return undefined;
}

function has(cmd: string): boolean {
  try {
    execFileSync("sh", ["-c", `command -v ${cmd}`], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

async function main(): Promise<number> {
  const dataDir = resolve(process.env.DATA_DIR || join(import.meta.dirname, "..", ".data"));
  const problems: string[] = [];
  try {
    const facts = await checkFirecrackerHost({ binary: firecrackerBinary(process.env) });
    console.log(`ok   firecracker ${facts.firecrackerVersion} (${facts.binary}), snapshot format ${facts.snapshotFormat}`);
    console.log(`ok   /dev/kvm usable; CPU ${describeCpu(facts.cpu)}; host kernel ${facts.hostKernel}`);
    console.log("     snapshots restore only on this firecracker release, CPU model and host kernel; elsewhere wakes boot cold");
  } catch (err) {
    if (!(err instanceof FirecrackerHostError)) throw err;
    problems.push(err.message);
  }
  const kernel = join(dataDir, "images", "demo", "vmlinux");
  const kp = kernelProblem(kernel);
  if (kp) problems.push(kp);
  else console.log(`ok   guest kernel ${kernel}`);
  const missingTools = ["ip", "nft"].filter((t) => !has(t));
  if (missingTools.length > 0) problems.push(`tap setup needs ${missingTools.join(" and ")}: apt-get install iproute2 nftables`);
  else console.log("ok   ip and nft present (tap setup: scripts/setup-firecracker-net.sh, run as root)");
  if (process.getuid?.() !== 0) problems.push("not root: creating tap devices and nftables rules needs CAP_NET_ADMIN");
  for (const p of problems) console.error(`FAIL ${p}`);
  return problems.length === 0 ? 0 : 1;
}

if (import.meta.main) process.exitCode = await main();
