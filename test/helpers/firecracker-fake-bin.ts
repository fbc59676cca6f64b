// Entry point of the fake `firecracker` binary the driver tests spawn (through a small wrapper script made by
// `makeFakeFirecrackerBinary`): answers --version / --snapshot-version, else serves the fake API on --api-sock.
// Its configuration file (first argument `--fake-config <path>`) is re-read at every start, so a test can
// change the behaviour or the version between spawns; every API request (and every guest agent command) is appended
// to its log as JSON lines.
import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { FakeFirecracker, type FakeBehaviour } from "./firecracker-fake.ts";
import { loadFirecrackerSpec } from "./firecracker-spec.ts";

export interface FakeBinaryConfig {
  version: string;
  snapshotFormat: string;
  specPath: string;
  requestLog: string;
  /** Guest agent commands the fake guest answered, as JSON lines. */
  guestLog: string;
  behaviour: FakeBehaviour;
}

const args = process.argv.slice(2);
const arg = (name: string) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};

const configPath = arg("--fake-config");
if (!configPath) {
  console.error("fake firecracker: --fake-config <path> missing");
  process.exit(2);
}
const config = JSON.parse(readFileSync(configPath, "utf8")) as FakeBinaryConfig;

if (args.includes("--version")) {
  process.stdout.write(`Firecracker v${config.version}\n\n`);
  process.exit(0);
}
if (args.includes("--snapshot-version")) {
  process.stdout.write(`v${config.snapshotFormat}\n`);
  process.exit(0);
}

const root = arg("--fake-root"); // set by the fake jailer: the chroot every API path is under
const apiSock = arg("--api-sock") && (root ? join(root, arg("--api-sock")!) : arg("--api-sock"));
if (!apiSock) {
  console.error("fake firecracker: --api-sock missing");
  process.exit(2);
}

const fake = new FakeFirecracker({
  apiSock,
  ...(root ? { root } : {}),
  spec: loadFirecrackerSpec(config.specPath),
  version: config.version,
  ...(arg("--id") ? { id: arg("--id")! } : {}),
  behaviour: config.behaviour,
  record: (r) => appendFileSync(config.requestLog, `${JSON.stringify(r)}\n`),
  recordGuest: (r) => appendFileSync(config.guestLog, `${JSON.stringify(r)}\n`),
  console: (line) => process.stdout.write(`${line}\n`),
  exit: (code, why) => {
    console.error(`fake firecracker exiting (${code}): ${why}`);
    process.exit(code);
  },
});
process.on("SIGTERM", () => process.exit(143));
await fake.listen();
console.error(`fake firecracker ${config.version} listening on ${apiSock} (pid ${process.pid})`);
