// bench:pool's systems: the all-in-one (gateway, host, embedded Postgres) on QEMU with templates and file-backed RAM, and the same over the process driver for the baseline.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAllInOneConfig, startAllInOne, type System } from "../../../compose/all-in-one.ts";
import type { VmDriver } from "../../../fleet-agent/drivers/driver.ts";
import { ProcessDriver } from "../../../fleet-agent/drivers/process/driver.ts";
import { QemuDriver } from "../../../fleet-agent/drivers/qemu/driver.ts";
import type { Accel } from "../../../fleet-agent/drivers/qemu/args.ts";
import type { GuestImage } from "../../../fleet-agent/guest/build-image.ts";
import { appendFileSync } from "node:fs";
import { qemuEnv, qemuOptionsOf } from "../../../fleet-agent/drivers/qemu/config.ts";
import { createLogger, type Logger, silentLogger } from "../../../lib/log.ts";
import { AgentVM } from "../../../sdk/typescript/src/index.ts";

export interface BenchSystem {
  system: System;
  driver: VmDriver;
  /** The SDK's client with the demo tenant's token: the bench calls the public API as a user would. */
  client: AgentVM;
  /** The system's DATA_DIR (a temporary directory, removed by stop): where the agents' state directories are. */
  dataDir: string;
  stop(): Promise<void>;
}

async function start(driver: VmDriver, prefix: string, log: Logger, stopDriver: () => Promise<void>): Promise<BenchSystem> {
  const dataDir = mkdtempSync(join(tmpdir(), prefix));
  const env: Record<string, string> = { REAPER_INTERVAL_MS: "1000", PORT: "0", DATA_DIR: dataDir };
  const system = await startAllInOne(parseAllInOneConfig(env, ["demo"]), { driver, log });
  return {
    system,
    driver,
    client: new AgentVM({ baseUrl: system.url, token: system.demo.token }),
    dataDir,
    async stop() {
      await system.stop();
      await stopDriver();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** A logger that appends the system's JSON lines to `file` (the bench's `--log`), or says nothing. */
export function benchLogger(file: string | undefined): Logger {
  return file ? createLogger({ level: "info", write: (line) => appendFileSync(file, `${line}\n`) }) : silentLogger;
}

/**
 * The system on QEMU with the defaults of npm start (file-backed RAM, templates, kept paused QEMUs), so forks share the
 * template's pages and a hibernated agent's wake is what a user's is.
 */
export async function qemuSystem(image: GuestImage, accel: Accel | "auto", log: Logger): Promise<BenchSystem & { qemu: QemuDriver }> {
  const templates = mkdtempSync(join(tmpdir(), "bench-pool-tpl-"));
  const qemu = new QemuDriver({ ...qemuOptionsOf(qemuEnv.parse({}), "file"), image, accel, templates: { root: templates }, log });
  const sys = await start(qemu, "bench-pool-", log, async () => {
    await qemu.templates?.settle();
    rmSync(templates, { recursive: true, force: true });
  });
  return { ...sys, qemu };
}

/** The same system over the process driver (the demo agent as a host process, its exec server beside it): the baseline. */
export function processSystem(): Promise<BenchSystem> {
  return start(new ProcessDriver({}), "bench-pool-proc-", silentLogger, async () => {});
}
