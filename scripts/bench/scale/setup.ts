// bench:scale's setup: a data directory on the chosen filesystem (a mkdtemp on the machine's own, or an XFS loop image), the system started on it with default settings, and what undoes both.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { findPgBin, startPostgres } from "../../postgres-server.ts";
import { mountXfsLoop } from "../../xfs-loop.ts";
import type { Cleanups } from "../density/cleanups.ts";
import { startHost, stopHost, type HostProcess } from "./host-process.ts";
import { freeBytes, MiB } from "./measure.ts";

export interface ScaleSetup {
  fs: "ext4" | "xfs";
  accel: "auto" | "kvm" | "tcg";
  /**
   * Where the system keeps its rows: a Postgres server of its own (`postgres`: the host process's memory is then its
   * own, as on a real host), or the embedded database in the host process (`embedded`: what `npm start` does).
   */
  database: "postgres" | "embedded";
  /** The data directory the guest image is built in (`--data-dir`). */
  imageDir: string;
  /** Free space to leave on the machine's disk, bytes. */
  marginBytes: number;
  say(line: string): void;
  cleanups: Cleanups;
}

export interface Started {
  host: HostProcess;
  /** Where the disk is checked: the data dir's filesystem and, on the loop image, the machine's disk under it. */
  diskDirs: string[];
  fsType: string;
  /** Which database the system used, in words. */
  databaseIs: string;
}

/** `--database`'s default: a Postgres server where its binaries are installed (provisioning installs them). */
export function defaultDatabase(): ScaleSetup["database"] {
  return findPgBin() ? "postgres" : "embedded";
}

/** The system's log of the last start: its tail is shown when the bench fails (the file goes with the data dir). */
export let lastLogFile: string | undefined;

export async function startOnFs(setup: ScaleSetup, tag: string): Promise<Started> {
  const { say, cleanups } = setup;
  const base = mkdtempSync(join(tmpdir(), `bench-scale-${tag}-`));
  cleanups.push(async () => rmSync(base, { recursive: true, force: true }));
  let dataDir = join(base, "data");
  let fsType = "machine's own (ext4)";
  if (setup.fs === "xfs") {
    // The sparse image takes what is written; sized to what the machine can give beyond the margin (at most 64 GiB).
    const sizeMiB = Math.max(4096, Math.min(65_536, Math.floor(((await freeBytes(base)) - setup.marginBytes) / MiB)));
    const xfs = await mountXfsLoop(base, { sizeMiB, log: say });
    cleanups.push(() => xfs.unmount());
    dataDir = join(xfs.mount, "data");
    fsType = `xfs loop image (${sizeMiB} MiB, reflinks)`;
  }
  mkdirSync(dataDir, { recursive: true });
  const env: Record<string, string> = { PORT: "0", DRIVER: "qemu", LOG_LEVEL: "warn" };
  if (setup.accel !== "auto") env.QEMU_ACCEL = setup.accel;
  let databaseIs = "embedded (PGlite in the host process)";
  if (setup.database === "postgres") {
    const pg = await startPostgres();
    cleanups.push(() => pg.stop());
    env.DATABASE_URL = pg.url;
    databaseIs = "a Postgres server of its own (the host process holds no rows)";
  }
  lastLogFile = join(base, "system.log");
  const host = await startHost({ env, imageDir: setup.imageDir, dataDir, logFile: lastLogFile });
  cleanups.push(async () => {
    const { qemusLeft } = await stopHost(host, 300_000);
    if (qemusLeft) say(`after the system stopped, ${qemusLeft} QEMU(s) of its data dir were left: ended by PID`);
  });
  say(`system up: pid ${host.pid}, ${host.url}, data dir ${dataDir} on ${fsType}, database ${databaseIs}`);
  return { host, diskDirs: setup.fs === "xfs" ? [dataDir, base] : [dataDir], fsType, databaseIs };
}
