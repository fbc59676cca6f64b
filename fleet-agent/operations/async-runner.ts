// Makes the async upstream calls agents queued (`Prefer: respond-async`): claims them under a lease, calls, retries what may be retried, and commits each outcome with its delivery.
import { type Backoff, parseRetryAfterMs, retryDelayMs } from "../../lib/backoff.ts";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import type { AsyncOperationStore, AsyncOutcome, ClaimedOperation, OperationRow } from "./async-store.ts";

/** An answer of the upstream, whatever its status. */
export interface AsyncAnswer {
  status: number;
  headers: [string, string][];
  body: Uint8Array;
  /** The body's content digest where it was kept. */
  responseBody: string | null;
  sentAt: Date;
  firstByteAt: Date;
  endedAt: Date;
  model: string | null;
  inputTokens: number | null;
  outputTokens: number | null;
}

/** Makes one attempt of the call; rejects (an AppError where it can) when no answer came. Aborted at the deadline or when the claim is lost. */
export type AsyncCall = (op: OperationRow, signal: AbortSignal) => Promise<AsyncAnswer>;

export interface AsyncRunnerConfig {
  /** How often to look for due calls when nothing kicks the runner, ms. */
  pollIntervalMs: number;
  /** How long a claim lasts without renewal; renewed every third of it while the call runs, ms. */
  leaseMs: number;
  /** Calls made at once by this runner. */
  concurrency: number;
  /** Attempts of one call at most (retries only where a repeat is safe). */
  maxAttempts: number;
  backoff: Backoff;
}

export interface AsyncRunnerDeps {
  store: AsyncOperationStore;
  call: AsyncCall;
  clock: Clock;
  log: Logger;
  config: AsyncRunnerConfig;
  /** 0..1, for the backoff's jitter (tests pass a fixed one). */
  random?: () => number;
}

/** Methods whose repeat has the effect of one call (RFC 9110 §9.2.2): a call with an `Idempotency-Key` is retried too. */
const idempotentMethods = new Set(["GET", "HEAD", "PUT", "DELETE", "OPTIONS"]);
/** Answers that say "try again" rather than "no". */
const transientStatuses = new Set([408, 429, 502, 503, 504]);
/** Failures without an answer that another attempt may not have (unreachable, cut, slow): not a refusal by policy, a missing upstream or an answer too large. */
const transientErrors: ReadonlySet<string> = new Set(["bad_gateway", "gateway_timeout", "host_unavailable"]);

/** Whether repeating the call is safe: an idempotent method, or a key the upstream deduplicates on. */
export function repeatable(op: Pick<OperationRow, "method" | "idempotencyKey">): boolean {
  return idempotentMethods.has(op.method.toUpperCase()) || op.idempotencyKey !== null;
}

/**
 * At-least-once for calls that may be repeated, at-most-once for the others: a claim whose earlier holder vanished
 * mid-call (`interrupted`) is made again only when `repeatable`, else it fails with `interrupted`; transient answers
 * and errors are retried the same way, with backoff, up to `maxAttempts` and never past the deadline. The outcome is
 * committed with its delivery in one transaction (async-store.ts `settle`), so a crash after the commit loses nothing
 * and a crash before it makes the call again under the same rules.
 */
export class AsyncOperationRunner {
  readonly id: string;
  private readonly deps: AsyncRunnerDeps;
  private readonly inFlight = new Set<Promise<void>>();
  private timer: { cancel(): void } | undefined;
  private running = false;
  private claiming = false;
  /** Aborts every call under way when `stop`'s grace is over. */
  private readonly stopping = new AbortController();

  /** `workerId`: who holds a claim (`operations.claimed_by`), unique per process: the host's id and a random part. */
  constructor(deps: AsyncRunnerDeps, workerId: string) {
    this.deps = deps;
    this.id = workerId;
  }

  /** Polls for due calls until stopped. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.schedule(0);
  }

  /**
   * Stop order: no new claims → the calls under way get `graceMs` to finish → the rest are aborted (their claims lapse,
   * and another runner, or this host after its restart, takes them over under the same rules) → resolves when all
   * attempts have ended.
   */
  async stop(graceMs = 0): Promise<void> {
    this.running = false;
    this.timer?.cancel();
    this.timer = undefined;
    const all = Promise.allSettled([...this.inFlight]);
    let grace: { cancel(): void } | undefined;
    await Promise.race([all, new Promise<void>((resolve) => (grace = this.deps.clock.setTimeout(resolve, graceMs)))]);
    grace?.cancel();
    this.stopping.abort(new AppError("host_unavailable", "the host stopped while the call was under way"));
    await all;
  }

  /** A call was queued: look now. */
  kick(): void {
    if (this.running) this.schedule(0);
  }

  /** Claims what is due (up to the free concurrency), attempts it, and resolves with how many it attempted. */
  async runOnce(): Promise<number> {
    const claimed = await this.claim();
    await Promise.all(claimed.map((c) => this.track(c)));
    return claimed.length;
  }

  /** Claims what is due, up to the free concurrency; nothing while a claim is under way or no slot is free. */
  private async claim(): Promise<ClaimedOperation[]> {
    const limit = this.deps.config.concurrency - this.inFlight.size;
    if (limit <= 0 || this.claiming) return [];
    this.claiming = true;
    try {
      return await this.deps.store.claimDue({ now: new Date(this.deps.clock.now()), limit, leaseMs: this.deps.config.leaseMs, workerId: this.id });
    } finally {
      this.claiming = false;
    }
  }

  private schedule(ms: number): void {
    this.timer?.cancel();
    this.timer = this.deps.clock.setTimeout(() => void this.tick(), ms);
  }

  private async tick(): Promise<void> {
    this.timer = undefined;
    if (!this.running) return;
    const free = this.deps.config.concurrency - this.inFlight.size;
    let claimed: ClaimedOperation[] = [];
    try {
      claimed = await this.claim();
    } catch (err) {
      this.deps.log.error("claiming async operations failed", { err: err instanceof Error ? err : String(err) });
    }
    for (const c of claimed) void this.track(c);
    if (this.running) this.schedule(claimed.length > 0 && claimed.length === free ? 0 : this.deps.config.pollIntervalMs);
  }

  private track(c: ClaimedOperation): Promise<void> {
    const p = this.attempt(c)
      .catch((err: unknown) => {
        // The claim expires and another runner takes the call over under the same rules.
        this.deps.log.error("async operation attempt could not be recorded", { operationId: c.row.id, err: err instanceof Error ? err : String(err) });
      })
      .finally(() => {
        this.inFlight.delete(p);
        if (this.running) this.schedule(0);
      });
    this.inFlight.add(p);
    return p;
  }

  private async attempt({ row: op, interrupted }: ClaimedOperation): Promise<void> {
    const { clock, config, store, log } = this.deps;
    const now = clock.now();
    const deadline = op.deadlineAt?.getTime() ?? Number.POSITIVE_INFINITY;
    if (now >= deadline) {
      await this.fail(op, new AppError("gateway_timeout", "the operation's deadline passed before the upstream answered"));
      return;
    }
    if (interrupted && !repeatable(op)) {
      await this.fail(
        op,
        new AppError(
          "bad_gateway",
          `interrupted: the host making this ${op.method} call was lost before it recorded an answer; the call may have reached the upstream and is not repeated (send an Idempotency-Key to make it retryable)`,
        ),
      );
      return;
    }
    const abort = new AbortController();
    const onStop = () => abort.abort(this.stopping.signal.reason);
    this.stopping.signal.addEventListener("abort", onStop, { once: true });
    const deadlineTimer = Number.isFinite(deadline)
      ? clock.setTimeout(() => abort.abort(new AppError("gateway_timeout", "the operation's deadline passed")), deadline - now)
      : undefined;
    let renewal: { cancel(): void } | undefined;
    const renew = () => {
      renewal = clock.setTimeout(() => {
        store
          .renew(op.id, this.id, new Date(clock.now() + config.leaseMs))
          .then((held) => {
            if (held) renew();
            else abort.abort(new AppError("conflict", "the claim on this operation was lost"));
          })
          .catch(() => renew());
      }, config.leaseMs / 3);
    };
    renew();
    let answer: AsyncAnswer | undefined;
    let error: AppError | undefined;
    try {
      answer = await this.deps.call(op, abort.signal);
    } catch (err) {
      error = abort.signal.aborted && abort.signal.reason instanceof AppError ? abort.signal.reason : asAppError(err);
    } finally {
      deadlineTimer?.cancel();
      renewal?.cancel();
      this.stopping.signal.removeEventListener("abort", onStop);
    }
    if (error?.code === "conflict") return; // another runner holds the call now
    if (this.stopping.signal.aborted) return; // the claim lapses: taken over after the restart, or by another host
    const transient = answer ? transientStatuses.has(answer.status) : transientErrors.has(error!.code) && clock.now() < deadline;
    if (transient && repeatable(op) && op.attempts < config.maxAttempts) {
      const hint = answer ? parseRetryAfterMs(headerOf(answer.headers, "retry-after"), clock.now()) : undefined;
      const at = clock.now() + retryDelayMs(op.attempts, config.backoff, (this.deps.random ?? Math.random)(), hint);
      if (at < deadline) {
        const why = answer ? { code: "upstream_status", message: `the upstream answered ${answer.status}` } : { code: error!.code, message: error!.message };
        if (await store.retryAt(op.id, this.id, new Date(at), why))
          log.info("async operation will be retried", { operationId: op.id, attempt: op.attempts, why: why.message });
        return;
      }
    }
    if (answer) {
      const settled = await store.settle(op.id, this.id, { state: "succeeded", error: null, ...answer });
      if (settled) log.info("async operation answered", { operationId: op.id, agentId: op.agentId, status: answer.status, attempts: op.attempts });
      return;
    }
    await this.fail(op, error!);
  }

  /** Settles the call as failed: the agent gets the error envelope as the outcome's body. */
  private async fail(op: OperationRow, err: AppError): Promise<void> {
    const at = new Date(this.deps.clock.now());
    const body = new TextEncoder().encode(JSON.stringify({ error: { code: err.code, message: err.message, operationId: op.id } }));
    const outcome: AsyncOutcome = {
      state: "failed",
      status: null,
      error: { code: err.code, message: err.message },
      headers: [["content-type", "application/json"]],
      body,
      responseBody: null,
      sentAt: op.sentAt,
      firstByteAt: null,
      endedAt: at,
      model: null,
      inputTokens: null,
      outputTokens: null,
    };
    if (await this.deps.store.settle(op.id, this.id, outcome))
      this.deps.log.warn("async operation failed", { operationId: op.id, agentId: op.agentId, why: err.message });
  }
}

function asAppError(err: unknown): AppError {
  if (err instanceof AppError) return err;
  return new AppError("bad_gateway", `the upstream call failed: ${err instanceof Error ? err.message : String(err)}`.slice(0, 300));
}

function headerOf(headers: [string, string][], name: string): string | null {
  return headers.find(([n]) => n === name)?.[1] ?? null;
}
