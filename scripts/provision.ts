// `npm test` runs this first: provisions what the suite needs on this machine (Postgres server binaries, QEMU and
// the guest image, the image tools, Chromium, nft), installing Debian's packages when root and missing. In CI (`CI=true`) anything missing fails.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { findPgBin } from "./postgres-server.ts";
import { customKernelFromEnv } from "../fleet-agent/guest/build-image.ts";
import { ensureImageTools } from "../images/build/tools.ts";
import { aptInstall, provisionVm } from "./setup-vm.ts";

const log = (line: string) => console.log(`provision: ${line}`);
const ci = process.env.CI === "true";

if (!findPgBin() && process.getuid?.() === 0 && existsSync("/etc/debian_version")) aptInstall(["postgresql"], log);
const pgBin = findPgBin();
if (!pgBin) throw new Error("no Postgres server binaries (initdb): install Debian's postgresql package (as root: apt-get install postgresql)");
log(`postgres server binaries: ${pgBin}`);

// Image builds (buildah, skopeo, umoci, debootstrap, e2fsprogs): the image tests need them.
const { missing } = ensureImageTools({ log, install: (packages) => aptInstall(packages, log) });
if (missing.length > 0 && ci) throw new Error(`image tools missing: ${missing.join(", ")}`);
if (missing.length === 0) log("image tools: buildah, skopeo, umoci, debootstrap, e2fsprogs present");

// The dashboard's end-to-end test drives Debian's Chromium headless through playwright-core (test/helpers/chromium.ts).
const chromium = "/usr/bin/chromium";
if (!existsSync(chromium) && process.getuid?.() === 0 && existsSync("/etc/debian_version")) aptInstall(["chromium"], log);
if (!existsSync(chromium) && ci) throw new Error("no Chromium for the dashboard test: install Debian's chromium package (as root: apt-get install chromium)");
log(existsSync(chromium) ? `chromium: ${chromium}` : "chromium: missing (the dashboard test says so and skips; as root: apt-get install chromium)");

// The fleet test runs one host with its clock 10 minutes ahead through Debian's libfaketime (LD_PRELOAD).
const faketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
if (!existsSync(faketime) && process.getuid?.() === 0 && existsSync("/etc/debian_version")) aptInstall(["libfaketime"], log);
if (!existsSync(faketime) && ci)
  throw new Error("no libfaketime for the fleet test's skewed host: install Debian's libfaketime package (as root: apt-get install libfaketime)");
log(
  existsSync(faketime)
    ? `libfaketime: ${faketime}`
    : "libfaketime: missing (the skewed-clock host test says so and skips; as root: apt-get install libfaketime)",
);

// The Firecracker tap test checks its nftables ruleset with `nft -c` (check mode: nothing is applied to the host).
const haveNft = () => spawnSync("sh", ["-c", "command -v nft"]).status === 0;
if (!haveNft() && process.getuid?.() === 0 && existsSync("/etc/debian_version")) aptInstall(["nftables"], log);
if (!haveNft() && ci) throw new Error("no nft for the Firecracker tap rules' check: install Debian's nftables package (as root: apt-get install nftables)");
log(haveNft() ? "nft: present" : "nft: missing (the tap rules' nft -c check says so and skips; as root: apt-get install nftables)");

const kernel = customKernelFromEnv(process.env);
await provisionVm({ ci, dataDir: resolve(process.env.DATA_DIR ?? ".data"), log, ...(kernel ? { kernel } : {}) });
