// `npm test` runs this first: provisions what the suite needs on this machine (Postgres server binaries, QEMU and
// the guest image), installing Debian's packages when root and missing. In CI (`CI=true`) anything missing fails.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { findPgBin } from "../test/helpers/postgres-server.ts";

const ci = process.env.CI === "true";
const isRoot = process.getuid?.() === 0;
const isDebian = existsSync("/etc/debian_version");
const log = (line: string) => console.log(`provision: ${line}`);

export function aptInstall(packages: string[]): void {
  log(`apt-get install ${packages.join(" ")}`);
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  try {
    execFileSync("apt-get", ["install", "-y", "-q", ...packages], { stdio: "inherit", env });
  } catch {
    execFileSync("apt-get", ["update", "-q"], { stdio: "inherit", env });
    execFileSync("apt-get", ["install", "-y", "-q", ...packages], { stdio: "inherit", env });
  }
}

function provisionPostgres(): void {
  if (findPgBin()) return log(`postgres server binaries: ${findPgBin()}`);
  if (isRoot && isDebian) {
    aptInstall(["postgresql"]);
    if (findPgBin()) return log(`postgres server binaries: ${findPgBin()}`);
  }
  throw new Error("no Postgres server binaries (initdb): install Debian's postgresql package (as root: apt-get install postgresql)");
}

provisionPostgres();
const { provisionVm } = await import("./setup-vm.ts");
await provisionVm({ ci, dataDir: resolve(process.env.DATA_DIR ?? ".data"), log });
