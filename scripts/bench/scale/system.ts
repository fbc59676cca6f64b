// bench:scale's system: the all-in-one as `npm start` assembles it, in a process of its own (so its RSS, fds and CPU are the host's alone), with the guest image of --image-dir; prints `READY {json}`.
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { allInOneConfigOf, allInOneEnv, startAllInOne } from "../../../compose/all-in-one.ts";
import { selectDriver } from "../../../fleet-agent/drivers/select.ts";
import { ensureGuestImage } from "../../../fleet-agent/guest/build-image.ts";
import { parseEnv } from "../../../lib/env.ts";
import { createLogger } from "../../../lib/log.ts";
import { stopOnSignals } from "../../../lib/signals.ts";
import { trimMalloc } from "../../../lib/node-malloc-trim.ts";

const { values } = parseArgs({ options: { "image-dir": { type: "string" } } });
if (!values["image-dir"]) throw new Error("--image-dir DIR: the data directory whose guest image the VMs run");
// The one read of the environment, as `npm start`'s: every setting at its default unless the bench set it.
const settings = parseEnv(allInOneEnv, process.env);
const log = createLogger({ level: settings.LOG_LEVEL });
const image = await ensureGuestImage({ dataDir: resolve(values["image-dir"]), log: () => undefined });
const selected = await selectDriver(settings.DRIVER, { dataDir: resolve(settings.DATA_DIR), log, settings, image });
const { driver, images, upstreams, exchanges } = selected;
const system = await startAllInOne(allInOneConfigOf(settings, images), { driver, log, exchanges, ...(upstreams ? { upstreams } : {}) });
console.log(`READY ${JSON.stringify({ url: system.url, token: system.demo.token, pid: process.pid, driver: driver.name })}`);
stopOnSignals(() => system.stop(), log);
// SIGUSR2: a full garbage collection (the process runs with --expose-gc), so the bench's RSS samples hold what is
// live; then what the JS heap and buffers hold, as a `MEMORY {json}` line.
// The collection is followed by a malloc trim, as the host does by itself every 30 s once its RSS grew (lib/node-malloc-trim.ts).
process.on("SIGUSR2", () => {
  (globalThis as { gc?: () => void }).gc?.();
  const t0 = performance.now();
  trimMalloc();
  const trimMs = Math.round((performance.now() - t0) * 10) / 10;
  const { heapUsed, external } = process.memoryUsage();
  console.log(`MEMORY ${JSON.stringify({ heapUsed, external, trimMs })}`);
});
