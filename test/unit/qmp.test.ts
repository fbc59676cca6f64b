// The QMP client against a fake QMP server on a unix socket: greeting, capabilities, typed results, QEMU's error desc, events.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { contAfterMigration, QmpClient, QmpClosedError, QmpError } from "../../fleet-agent/drivers/qemu/qmp.ts";

const greeting = { QMP: { version: { qemu: { major: 7, minor: 2, micro: 22 }, package: "Debian 1:7.2+dfsg-7" }, capabilities: ["oob"] } };

interface Fake {
  path: string;
  server: Server;
  received: Array<{ execute: string; arguments?: unknown; id?: unknown }>;
  clients: Socket[];
  /** Sends an event to every connected client. */
  emit(event: string, data?: Record<string, unknown>): void;
  close(): Promise<void>;
}

/**
 * Behaves like QEMU's monitor: greeting first, every command but qmp_capabilities refused until
 * capabilities are negotiated, answers carry the request id, events interleave.
 */
async function fakeQmp(
  handlers: Record<string, (args: unknown) => { return: unknown } | { error: { class: string; desc: string } } | "hang"> = {},
  opts: { path?: string; listen?: boolean } = {},
): Promise<Fake> {
  const dir = mkdtempSync(join(tmpdir(), "qmp-test-"));
  const path = opts.path ?? join(dir, "qmp.sock");
  const received: Fake["received"] = [];
  const clients: Socket[] = [];
  const server = createServer((socket) => {
    clients.push(socket);
    let negotiated = false;
    let buffer = "";
    socket.write(`${JSON.stringify(greeting)}\r\n`);
    socket.on("data", (chunk) => {
      buffer += chunk.toString();
      let nl: number;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const msg = JSON.parse(buffer.slice(0, nl)) as { execute: string; arguments?: unknown; id?: unknown };
        buffer = buffer.slice(nl + 1);
        received.push(msg);
        const answer = (body: Record<string, unknown>) => socket.write(`${JSON.stringify({ ...body, id: msg.id })}\r\n`);
        if (msg.execute === "qmp_capabilities") {
          negotiated = true;
          answer({ return: {} });
          continue;
        }
        if (!negotiated) {
          answer({ error: { class: "CommandNotFound", desc: "Expecting capabilities negotiation with 'qmp_capabilities'" } });
          continue;
        }
        const handler = handlers[msg.execute];
        if (!handler) {
          answer({ error: { class: "CommandNotFound", desc: `The command ${msg.execute} has not been found` } });
          continue;
        }
        const result = handler(msg.arguments);
        if (result !== "hang") answer(result);
      }
    });
    socket.on("error", () => {});
  });
  if (opts.listen !== false) await new Promise<void>((r) => server.listen(path, r));
  return {
    path,
    server,
    received,
    clients,
    emit(event, data) {
      for (const c of clients) c.write(`${JSON.stringify({ event, data, timestamp: { seconds: 1, microseconds: 2 } })}\r\n`);
    },
    async close() {
      for (const c of clients) c.destroy();
      await new Promise<void>((r) => server.close(() => r()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

describe("QmpClient", () => {
  it("reads the greeting and negotiates capabilities before anything else", async () => {
    const fake = await fakeQmp({ "query-status": () => ({ return: { running: true, status: "running" } }) });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    expect(qmp.greeting.QMP.version.qemu).toEqual({ major: 7, minor: 2, micro: 22 });
    expect(fake.received[0]?.execute).toBe("qmp_capabilities");
    const status = await qmp.execute("query-status");
    expect(status).toEqual({ running: true, status: "running" });
  });

  it("sends arguments and matches answers to requests by id, even out of order", async () => {
    const fake = await fakeQmp({
      "query-migrate": () => "hang",
      migrate: (args) => ({ return: { echoed: args } }),
    });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    const slow = qmp.execute("query-migrate");
    const fast = await qmp.execute("migrate", { uri: "exec:cat > /tmp/x" });
    expect(fast).toEqual({ echoed: { uri: "exec:cat > /tmp/x" } });
    const pendingId = fake.received.find((m) => m.execute === "query-migrate")!.id;
    fake.clients[0]!.write(`${JSON.stringify({ return: { status: "completed" }, id: pendingId })}\r\n`);
    expect(await slow).toEqual({ status: "completed" });
  });

  it("surfaces QEMU's error class and desc", async () => {
    const fake = await fakeQmp({ "migrate-incoming": () => ({ error: { class: "GenericError", desc: "'-incoming' was not specified on the command line" } }) });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    const err = await qmp.execute("migrate-incoming", { uri: "exec:cat /x" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(QmpError);
    expect(err).toMatchObject({ klass: "GenericError", desc: "'-incoming' was not specified on the command line", command: "migrate-incoming" });
    expect((err as Error).message).toContain("'-incoming' was not specified");
    const unknown = await qmp.execute("cont").catch((e: unknown) => e);
    expect(unknown).toMatchObject({ klass: "CommandNotFound" });
  });

  it("delivers events to subscribers and to waitForEvent with a filter", async () => {
    const fake = await fakeQmp();
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    const seen: string[] = [];
    const off = qmp.onEvent((e) => seen.push(e.event));
    const completed = qmp.waitForEvent("MIGRATION", { match: (e) => e.data?.status === "completed", timeoutMs: 2000 });
    fake.emit("STOP");
    fake.emit("MIGRATION", { status: "active" });
    fake.emit("MIGRATION", { status: "completed" });
    const e = await completed;
    expect(e).toMatchObject({ event: "MIGRATION", data: { status: "completed" }, timestamp: { seconds: 1, microseconds: 2 } });
    expect(seen).toEqual(["STOP", "MIGRATION", "MIGRATION"]);
    off();
    fake.emit("RESUME");
    await expect(qmp.waitForEvent("NEVER", { timeoutMs: 50 })).rejects.toThrow(/no NEVER event within 50 ms/);
    expect(seen).toEqual(["STOP", "MIGRATION", "MIGRATION"]);
  });

  it("rejects pending commands and event waiters when QEMU goes away, and refuses new ones", async () => {
    const fake = await fakeQmp({ quit: () => "hang" });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    const pending = qmp.execute("quit");
    const waiter = qmp.waitForEvent("SHUTDOWN");
    for (const c of fake.clients) c.destroy();
    await expect(pending).rejects.toBeInstanceOf(QmpClosedError);
    await expect(waiter).rejects.toBeInstanceOf(QmpClosedError);
    await expect(qmp.execute("stop")).rejects.toBeInstanceOf(QmpClosedError);
    expect(qmp.closed).toBe(true);
  });

  it("waits for a socket that appears late (QEMU starting), and gives up when the process died", async () => {
    const dir = mkdtempSync(join(tmpdir(), "qmp-late-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const path = join(dir, "qmp.sock");
    const fake = await fakeQmp({}, { path, listen: false });
    cleanups.push(() => fake.close());
    setTimeout(() => fake.server.listen(path), 150);
    const started = performance.now();
    const qmp = await QmpClient.connect(path, { timeoutMs: 5000 });
    cleanups.push(() => qmp.close());
    expect(performance.now() - started).toBeGreaterThanOrEqual(100);

    let alive = true;
    setTimeout(() => (alive = false), 50);
    const t0 = performance.now();
    await expect(QmpClient.connect(join(dir, "never.sock"), { timeoutMs: 5000, alive: () => alive })).rejects.toMatchObject({ code: "ENOENT" });
    expect(performance.now() - t0).toBeLessThan(1000);
  });

  it("times out a command QEMU never answers", async () => {
    const fake = await fakeQmp({ stop: () => "hang" });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    await expect(qmp.execute("stop", undefined, 50)).rejects.toThrow(/did not answer within 50 ms/);
  });
});

describe("contAfterMigration", () => {
  const notFinalized = { error: { class: "GenericError", desc: "Migration is not finalized yet" } };

  it("runs the VM on once the migration's thread has let go of it, not before", async () => {
    let refusals = 3;
    const fake = await fakeQmp({ cont: () => (refusals-- > 0 ? notFinalized : { return: {} }) });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    await contAfterMigration(qmp);
    expect(fake.received.filter((m) => m.execute === "cont")).toHaveLength(4);
  });

  it("gives up on that refusal after its deadline, and on any other refusal at once", async () => {
    const fake = await fakeQmp({ cont: () => notFinalized });
    cleanups.push(() => fake.close());
    const qmp = await QmpClient.connect(fake.path);
    cleanups.push(() => qmp.close());
    const t0 = performance.now();
    await expect(contAfterMigration(qmp, 100)).rejects.toThrow(/not finalized/);
    expect(performance.now() - t0).toBeLessThan(1000);
    expect(fake.received.filter((m) => m.execute === "cont").length).toBeGreaterThan(2);

    const other = await fakeQmp({ cont: () => ({ error: { class: "GenericError", desc: "Resetting the Virtual Machine is required" } }) });
    cleanups.push(() => other.close());
    const qmp2 = await QmpClient.connect(other.path);
    cleanups.push(() => qmp2.close());
    await expect(contAfterMigration(qmp2)).rejects.toThrow(/Resetting/);
    expect(other.received.filter((m) => m.execute === "cont")).toHaveLength(1);
  });
});
