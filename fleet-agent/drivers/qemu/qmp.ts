// Typed client for QEMU's machine protocol (QMP) over a unix socket: greeting, capabilities, commands, events.
import { connect, type Socket } from "node:net";

export interface QmpGreeting {
  QMP: { version: { qemu: { major: number; minor: number; micro: number }; package: string }; capabilities: string[] };
}

export type MigrationStatus =
  | "none"
  | "setup"
  | "cancelling"
  | "cancelled"
  | "active"
  | "postcopy-active"
  | "postcopy-paused"
  | "postcopy-recover"
  | "completed"
  | "failed"
  | "colo"
  | "pre-switchover"
  | "device"
  | "wait-unplug";

export interface MigrationInfo {
  status?: MigrationStatus;
  "total-time"?: number;
  downtime?: number;
  "setup-time"?: number;
  ram?: { transferred: number; total: number; remaining: number; duplicate: number; normal: number; "normal-bytes": number; mbps: number };
  "error-desc"?: string;
}

export interface StatusInfo {
  running: boolean;
  status: string;
}

export interface VersionInfo {
  qemu: { major: number; minor: number; micro: number };
  package: string;
}

/** The commands this project sends, with their argument and result types (QEMU's QAPI schema, subset). */
export interface QmpCommands {
  qmp_capabilities: { args: { enable?: string[] }; result: Record<string, never> };
  stop: { args: undefined; result: Record<string, never> };
  cont: { args: undefined; result: Record<string, never> };
  quit: { args: undefined; result: Record<string, never> };
  "query-status": { args: undefined; result: StatusInfo };
  "query-version": { args: undefined; result: VersionInfo };
  migrate: { args: { uri: string }; result: Record<string, never> };
  migrate_cancel: { args: undefined; result: Record<string, never> };
  "migrate-incoming": { args: { uri: string }; result: Record<string, never> };
  "query-migrate": { args: undefined; result: MigrationInfo };
  "migrate-set-capabilities": { args: { capabilities: Array<{ capability: string; state: boolean }> }; result: Record<string, never> };
  "migrate-set-parameters": { args: Record<string, number | string | boolean>; result: Record<string, never> };
  "human-monitor-command": { args: { "command-line": string }; result: string };
}

export type QmpCommand = keyof QmpCommands;

export interface QmpEvent {
  event: string;
  data?: Record<string, unknown>;
  timestamp?: { seconds: number; microseconds: number };
}

/** A command QEMU refused; `klass` and `desc` are QEMU's own. */
export class QmpError extends Error {
  override name = "QmpError";
  readonly klass: string;
  readonly desc: string;
  readonly command: string;
  constructor(command: string, klass: string, desc: string) {
    super(`QMP ${command}: ${desc}`);
    this.command = command;
    this.klass = klass;
    this.desc = desc;
  }
}

/** The connection is gone (QEMU exited, or the socket never came up). */
export class QmpClosedError extends Error {
  override name = "QmpClosedError";
}

interface Pending {
  command: string;
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout | undefined;
}

type EventListener = (e: QmpEvent) => void;

export class QmpClient {
  readonly greeting: QmpGreeting;
  private readonly socket: Socket;
  private buffer = "";
  private nextId = 1;
  private readonly pending = new Map<string, Pending>();
  private readonly listeners = new Set<EventListener>();
  private closedError: Error | undefined;
  private readonly closeWaiters: Array<() => void> = [];

  private constructor(socket: Socket, greeting: QmpGreeting, rest: string) {
    this.socket = socket;
    this.greeting = greeting;
    socket.on("data", (chunk: string) => this.onData(chunk));
    socket.on("error", (err) => this.fail(new QmpClosedError(`QMP connection error: ${err.message}`)));
    socket.on("close", () => this.fail(new QmpClosedError("QMP connection closed")));
    if (rest) this.onData(rest);
  }

  /**
   * Connects, reads the greeting and negotiates capabilities. Retries while the socket does not exist
   * yet (QEMU still starting) until `timeoutMs`; `alive` lets the caller stop early when QEMU died.
   */
  static async connect(path: string, opts: { timeoutMs?: number; alive?: () => boolean; commandTimeoutMs?: number } = {}): Promise<QmpClient> {
    const deadline = performance.now() + (opts.timeoutMs ?? 10_000);
    for (;;) {
      try {
        const client = await QmpClient.connectOnce(path, Math.max(100, deadline - performance.now()));
        try {
          await client.execute("qmp_capabilities", undefined, opts.commandTimeoutMs);
        } catch (err) {
          client.close();
          throw err;
        }
        return client;
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        const retriable = code === "ENOENT" || code === "ECONNREFUSED";
        if (!retriable || performance.now() > deadline || (opts.alive && !opts.alive())) throw err;
        await new Promise((r) => setTimeout(r, 2)); // QEMU creates the socket a few ms after it starts
      }
    }
  }

  private static connectOnce(path: string, timeoutMs: number): Promise<QmpClient> {
    return new Promise((resolve, reject) => {
      const socket = connect(path);
      socket.setEncoding("utf8");
      let buffer = "";
      const timer = setTimeout(() => done(new QmpClosedError(`no QMP greeting on ${path} within ${Math.round(timeoutMs)} ms`)), timeoutMs);
      const onData = (chunk: string) => {
        buffer += chunk;
        const nl = buffer.indexOf("\n");
        if (nl < 0) return;
        try {
          const greeting = JSON.parse(buffer.slice(0, nl)) as QmpGreeting;
          if (!greeting.QMP) throw new Error(`not a QMP greeting: ${buffer.slice(0, nl)}`);
          done(undefined, new QmpClient(socket, greeting, buffer.slice(nl + 1)));
        } catch (err) {
          done(err as Error);
        }
      };
      const onError = (err: Error) => done(err);
      const onClose = () => done(new QmpClosedError("QMP socket closed before the greeting"));
      function done(err?: Error, client?: QmpClient) {
        clearTimeout(timer);
        socket.off("data", onData);
        socket.off("error", onError);
        socket.off("close", onClose);
        if (err) {
          socket.destroy();
          reject(err);
        } else resolve(client!);
      }
      socket.on("data", onData);
      socket.on("error", onError);
      socket.on("close", onClose);
    });
  }

  /** Runs a command; rejects with QmpError carrying QEMU's `desc`, or QmpClosedError. */
  execute<K extends QmpCommand>(command: K, args?: QmpCommands[K]["args"], timeoutMs = 30_000): Promise<QmpCommands[K]["result"]> {
    if (this.closedError) return Promise.reject(this.closedError);
    const id = `q${this.nextId++}`;
    return new Promise((resolve, reject) => {
      const timer =
        timeoutMs > 0
          ? setTimeout(() => {
              this.pending.delete(id);
              reject(new QmpClosedError(`QMP ${command} did not answer within ${timeoutMs} ms`));
            }, timeoutMs)
          : undefined;
      this.pending.set(id, { command, resolve: resolve as (v: unknown) => void, reject, timer });
      const message: Record<string, unknown> = { execute: command, id };
      if (args !== undefined) message.arguments = args;
      this.socket.write(`${JSON.stringify(message)}\n`);
    });
  }

  /** Subscribes to every event; returns the unsubscribe function. */
  onEvent(listener: EventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Resolves with the first event named `name` (matching `match`) from now on. */
  waitForEvent(name: string, opts: { timeoutMs?: number; match?: (e: QmpEvent) => boolean; signal?: AbortSignal } = {}): Promise<QmpEvent> {
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      let off = () => {};
      const onAbort = () => finish(opts.signal?.reason instanceof Error ? opts.signal.reason : new Error("aborted"));
      const onClose = () => finish(this.closedError ?? new QmpClosedError("QMP connection closed"));
      const finish = (err: Error | undefined, event?: QmpEvent) => {
        off();
        if (timer) clearTimeout(timer);
        opts.signal?.removeEventListener("abort", onAbort);
        const i = this.closeWaiters.indexOf(onClose);
        if (i >= 0) this.closeWaiters.splice(i, 1);
        if (err) reject(err);
        else resolve(event!);
      };
      if (this.closedError) return onClose();
      off = this.onEvent((e) => {
        if (e.event === name && (!opts.match || opts.match(e))) finish(undefined, e);
      });
      if (opts.timeoutMs) timer = setTimeout(() => finish(new QmpClosedError(`no ${name} event within ${opts.timeoutMs} ms`)), opts.timeoutMs);
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      this.closeWaiters.push(onClose);
    });
  }

  get closed(): boolean {
    return this.closedError !== undefined;
  }

  close(): void {
    this.socket.destroy();
  }

  private onData(chunk: string): void {
    this.buffer += chunk;
    let nl: number;
    while ((nl = this.buffer.indexOf("\n")) >= 0) {
      const line = this.buffer.slice(0, nl).trim();
      this.buffer = this.buffer.slice(nl + 1);
      if (!line) continue;
      let msg: { id?: string; return?: unknown; error?: { class: string; desc: string }; event?: string };
      try {
        msg = JSON.parse(line);
      } catch {
        continue;
      }
      if (msg.event) {
        for (const l of [...this.listeners]) l(msg as QmpEvent);
        continue;
      }
      if (msg.id === undefined) continue;
      const waiter = this.pending.get(msg.id);
      if (!waiter) continue;
      this.pending.delete(msg.id);
      if (waiter.timer) clearTimeout(waiter.timer);
      if (msg.error) waiter.reject(new QmpError(waiter.command, msg.error.class, msg.error.desc));
      else waiter.resolve(msg.return);
    }
  }

  private fail(err: Error): void {
    if (this.closedError) return;
    this.closedError = err;
    for (const [, w] of this.pending) {
      if (w.timer) clearTimeout(w.timer);
      w.reject(err);
    }
    this.pending.clear();
    for (const w of this.closeWaiters.splice(0)) w();
  }
}

/** QEMU's answer to `cont` while a migration's thread still holds the VM in `finish-migrate`. */
const NOT_FINALIZED = /Migration is not finalized yet/;

/**
 * `cont` once a migration has let go of the VM. QEMU reports a migration failed (or completed) before its thread has
 * put the run state back, and a `cont` in between is refused ("Migration is not finalized yet"); on a loaded host that
 * window is long enough to hit, and a VM given up on there loses what it did since its last snapshot. Retried for that
 * refusal only, until `timeoutMs`; any other refusal is thrown at once.
 */
export async function contAfterMigration(qmp: Pick<QmpClient, "execute">, timeoutMs = 5000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (let wait = 2; ; wait = Math.min(wait * 2, 50)) {
    try {
      await qmp.execute("cont");
      return;
    } catch (err) {
      if (!(err instanceof QmpError) || !NOT_FINALIZED.test(err.desc) || performance.now() + wait > deadline) throw err;
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}
