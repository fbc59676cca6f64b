// Moving a QEMU's state in and out (QMP `migrate` and `migrate-incoming`): to a file through cat, over a unix socket
// (hashed as it arrives), split into device state and a clone's own RAM file (ram-stream.ts); waiting for a migration
// to end, and running the guest on after a snapshot that did not become the VM.
import { createHash, randomBytes } from "node:crypto";
import { closeSync, createWriteStream, fsyncSync, openSync, rmSync, statSync } from "node:fs";
import { open } from "node:fs/promises";
import { connect, createServer, type Socket } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../../lib/log.ts";
import { cowCopy, type CopyKind } from "../common/cow-copy.ts";
import { fixGuestClock } from "../common/guest-agent.ts";
import { fsyncPath } from "../common/snapshot-files.ts";
import { shellQuote } from "./args.ts";
import type { Phases } from "./phases.ts";
import { contAfterMigration, type MigrationInfo } from "./qmp.ts";
import { RamFileWriter, RamStreamSplitter } from "./ram-stream.ts";
import { removePartialSnapshots } from "./snapshot.ts";
import type { QemuVm } from "./vm.ts";

/** query-migrate's interval when no MIGRATION event comes (events make it rarely matter). */
const MIGRATION_POLL_MS = 20;

/**
 * Writes the stopped VM's state (device state; with streamed memory all guest RAM too) into `to.data`. The marker
 * `to.done` is written only after cat has flushed and closed the file: QEMU may report "completed" while cat is
 * still writing.
 */
export async function migrateToFile(vp: QemuVm, to: { data: string; done: string }, signal?: AbortSignal, phases?: Phases): Promise<void> {
  await vp.qmp!.execute("migrate", { uri: `exec:cat > ${shellQuote(to.data)} && : > ${shellQuote(to.done)}` });
  phases?.mark("migrateCmd");
  const info = await waitMigration(vp, { signal, timeoutMs: 120_000 });
  phases?.mark("migrate");
  if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
  await waitForFile(to.done, 10_000, signal);
  phases?.mark("writerDone");
  signal?.throwIfAborted();
}

/**
 * File-backed RAM: the stopped VM's device state (tens of KB) over a unix socket into `dataPath`, hashed as it
 * arrives. Against `exec:cat > file` QEMU forks no shell, nothing polls for a marker, and the file is not read back
 * for its checksum. Prepared while the guest still runs (the socket listening, the file being created): `run` then only
 * asks QEMU to migrate; the state is written at its end and its fsync is `durable`, for the caller to await beside
 * the manifest's own write (the manifest is renamed into place only after both).
 */
export async function socketMigration(
  vp: QemuVm,
  dataPath: string,
): Promise<{
  run(signal?: AbortSignal, phases?: Phases): Promise<{ sha256: string; bytes: number; durable: Promise<void> }>;
  close(): Promise<void>;
}> {
  const sock = join(vp.paths.socketDir, "mig.sock"); // no longer than agent.sock: it fits where that one does
  rmSync(sock, { force: true });
  // Opened alongside `stop` and the migration, awaited only to write what arrived: a thread-pool round trip (and any
  // journal commit a create queues behind) off the path before `stop`.
  const opened = open(dataPath, "wx");
  opened.catch(() => undefined);
  const hash = createHash("sha256");
  const chunks: Buffer[] = [];
  let bytes = 0;
  let conn: Socket | undefined;
  const server = createServer();
  const timeout = new AbortController();
  const received = new Promise<void>((resolve, reject) => {
    server.once("connection", (c) => {
      conn = c;
      server.close();
      c.on("data", (chunk: Buffer) => {
        hash.update(chunk);
        chunks.push(chunk);
        bytes += chunk.length;
      });
      c.once("end", resolve);
      c.once("error", reject);
    });
  });
  received.catch(() => undefined);
  let durable: Promise<void> | undefined;
  const close = async () => {
    timeout.abort();
    conn?.destroy();
    server.close();
    rmSync(sock, { force: true });
    await durable?.catch(() => undefined);
    await (await opened.catch(() => undefined))?.close();
  };
  try {
    await new Promise<void>((resolve, reject) => server.once("error", reject).listen(sock, resolve));
  } catch (err) {
    await close();
    throw err;
  }
  return {
    close,
    run: async (signal, phases) => {
      await vp.qmp!.execute("migrate", { uri: `unix:${sock}` });
      phases?.mark("migrateCmd");
      const info = await waitMigration(vp, { signal, timeoutMs: 120_000 });
      if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
      const late = sleep(10_000, undefined, { signal: timeout.signal }).then(() =>
        Promise.reject(new Error("the migration stream did not end within 10 s of QEMU's completion")),
      );
      late.catch(() => undefined);
      await Promise.race([received, late]);
      phases?.mark("migrate");
      signal?.throwIfAborted();
      const fh = await opened;
      await fh.writev(chunks);
      phases?.mark("stateWrite");
      durable = fh.sync();
      return { sha256: hash.digest("hex"), bytes, durable };
    },
  };
}

/**
 * A restore's device state (read and verified already) into the QEMU waiting in `-incoming defer`, over a unix
 * socket it listens on: no `exec:cat` for QEMU to fork.
 */
export async function sendIncoming(vp: QemuVm, data: Buffer, socketName = "mig.sock"): Promise<void> {
  const sock = join(vp.paths.socketDir, socketName);
  rmSync(sock, { force: true });
  await vp.qmp!.execute("migrate-incoming", { uri: `unix:${sock}` });
  try {
    await new Promise<void>((resolve, reject) => {
      const c = connect(sock);
      c.on("error", reject); // after the send: QEMU closing early shows in the migration's status

      c.once("connect", () => c.end(data, () => resolve()));
    });
  } finally {
    rmSync(sock, { force: true });
  }
}

/** A copy of the template's RAM file the VM maps (a reflink where the filesystem can), at `to` or a temporary beside the VM's. */
export async function copyTemplateRam(vp: QemuVm, to?: string): Promise<{ file: string; copy: CopyKind }> {
  const file = to ?? `${vp.paths.ram}.tmp-${randomBytes(4).toString("hex")}`;
  return { file, copy: await cowCopy(`/proc/${process.pid}/fd/${vp.templateFd!}`, file) };
}

/**
 * Migrates the stopped VM over a unix socket into `dataPath` and `ramFile` (ram-stream.ts): device state to the
 * first, the guest RAM's pages that differ from the template's into the second (a copy of it). Both are synced.
 */
export async function migrateSplitting(
  vp: QemuVm,
  dataPath: string,
  ramFile: string,
  log: Logger,
  signal?: AbortSignal,
): Promise<{ sha256: string; bytes: number; pages: number }> {
  const sock = join(vp.paths.socketDir, "mig.sock"); // no longer than agent.sock: it fits where that one does
  rmSync(sock, { force: true });
  const hash = createHash("sha256");
  let bytes = 0;
  const out = createWriteStream(dataPath, { flags: "wx" });
  const baseFd = vp.templateFd!;
  const ramFd = openSync(ramFile, "r+");
  const writer = new RamFileWriter(baseFd, ramFd);
  let conn: Socket | undefined;
  const server = createServer();
  try {
    const received = new Promise<void>((resolve, reject) => {
      const splitter = new RamStreamSplitter(
        (chunk) => {
          hash.update(chunk);
          bytes += chunk.length;
          if (!out.write(chunk)) {
            conn?.pause();
            out.once("drain", () => conn?.resume());
          }
        },
        writer,
        { ramBlock: vp.ramId, ignoreShared: true },
      );
      server.once("connection", (c) => {
        conn = c;
        server.close();
        c.on("data", (chunk: Buffer) => {
          try {
            splitter.push(chunk);
          } catch (err) {
            c.destroy();
            reject(err as Error);
          }
        });
        c.once("end", () => {
          try {
            splitter.end();
            out.end();
          } catch (err) {
            reject(err as Error);
          }
        });
        c.once("error", reject);
      });
      out.once("finish", resolve);
      out.once("error", reject);
    });
    received.catch(() => undefined);
    await new Promise<void>((resolve, reject) => server.once("error", reject).listen(sock, resolve));
    await vp.qmp!.execute("migrate", { uri: `unix:${sock}` });
    const info = await waitMigration(vp, { signal, timeoutMs: 120_000 });
    if (info.status !== "completed") throw new Error(`snapshot migration ${info.status}: ${info["error-desc"] ?? "no detail"}`);
    await Promise.race([received, sleep(10_000).then(() => Promise.reject(new Error("the migration stream did not end within 10 s of QEMU's completion")))]);
    signal?.throwIfAborted();
    fsyncSync(ramFd);
    await fsyncPath(dataPath);
    log.debug("clone's RAM split from its migration", { vmId: vp.spec.vmId, stateBytes: bytes, pagesWritten: writer.written });
    return { sha256: hash.digest("hex"), bytes, pages: writer.written };
  } finally {
    conn?.destroy();
    server.close();
    out.destroy();
    closeSync(ramFd);
    rmSync(sock, { force: true });
  }
}

/**
 * Waits until the migration leaves its active states; cancels it when `signal` aborts. Event-driven: QEMU announces
 * each status change (MIGRATION, the `events` capability set at launch), and that, QEMU's exit or the abort brings
 * the next query-migrate at once; without any, one runs every MIGRATION_POLL_MS all the same.
 */
export async function waitMigration(vp: QemuVm, opts: { signal?: AbortSignal | undefined; timeoutMs: number }): Promise<MigrationInfo> {
  const qmp = vp.qmp!;
  const deadline = performance.now() + opts.timeoutMs;
  let cancelled = false;
  let pending = false; // something happened since the last query
  let wakeUp: (() => void) | undefined;
  const nudge = () => {
    pending = true;
    wakeUp?.();
  };
  const off = qmp.onEvent((e) => {
    if (e.event === "MIGRATION") nudge();
  });
  opts.signal?.addEventListener("abort", nudge);
  void vp.proc.exited.then(nudge);
  try {
    for (;;) {
      pending = false;
      if (vp.proc.exit) throw new Error(`QEMU exited during the migration: ${(await vp.proc.finalOutput()) || "no message"}`);
      if (opts.signal?.aborted && !cancelled) {
        cancelled = true;
        await qmp.execute("migrate_cancel").catch(() => undefined);
      }
      const info = await qmp.execute("query-migrate");
      const s = info.status;
      if (s === "completed" || s === "failed" || s === "cancelled") {
        if (cancelled) opts.signal?.throwIfAborted();
        return info;
      }
      if (performance.now() > deadline) {
        await qmp.execute("migrate_cancel").catch(() => undefined);
        throw new Error(`migration still ${s ?? "pending"} after ${Math.round(opts.timeoutMs)} ms`);
      }
      if (pending) continue;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, MIGRATION_POLL_MS);
        wakeUp = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      wakeUp = undefined;
    }
  } finally {
    off();
    opts.signal?.removeEventListener("abort", nudge);
    wakeUp = undefined;
  }
}

async function waitForFile(path: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    signal?.throwIfAborted();
    try {
      statSync(path);
      return;
    } catch {
      if (performance.now() > deadline) throw new Error(`snapshot writer did not finish within ${timeoutMs} ms`);
      await sleep(2);
    }
  }
}

/**
 * After a cancelled or failed snapshot, or a checkpoint: end any migration, run the guest again, fix its clock, drop
 * partial snapshot files.
 * A VM that cannot be run again is killed as a crash (its exit is reported), never left paused for the host to
 * believe it is running.
 */
export async function resumeAfterSnapshot(vp: QemuVm, aborted: boolean, log: Logger): Promise<void> {
  const qmp = vp.qmp!;
  try {
    const info = await qmp.execute("query-migrate");
    if (info.status && !["completed", "failed", "cancelled", "none"].includes(info.status)) {
      await qmp.execute("migrate_cancel");
      for (let i = 0; i < 1000; i++) {
        const s = (await qmp.execute("query-migrate")).status;
        if (s === "completed" || s === "failed" || s === "cancelled") break;
        await sleep(3);
      }
    }
    await contAfterMigration(qmp);
  } catch (err) {
    log.error("could not resume the VM after a failed snapshot; killing it", { vmId: vp.spec.vmId, aborted, err });
    vp.proc.signal("SIGKILL");
  }
  // The guest clock stood still while the VM was stopped.
  if (!vp.proc.exit)
    await fixGuestClock(vp.agent!, { sameNetwork: true }).catch((err: unknown) =>
      log.warn("guest clock not fixed after a failed snapshot", { vmId: vp.spec.vmId, err }),
    );
  await removePartialSnapshots(vp.spec.stateDir);
}

/** Whether the VM's migrations skip its shared RAM file (on from launch for file-backed RAM; off to stream the file's pages). */
export function setIgnoreShared(vp: QemuVm, on: boolean): Promise<unknown> {
  return vp.qmp!.execute("migrate-set-capabilities", { capabilities: [{ capability: "x-ignore-shared", state: on }] });
}
