// Delivers stored webhooks: claims due deliveries under a lease, wakes and forwards through the gateway, retries with backoff, dead-letters.
import { count, inArray } from "drizzle-orm";
import { AppError } from "../../lib/errors.ts";
import { noopMetrics, type Metrics } from "../../lib/metrics.ts";
import type { Db } from "../../schema/db.ts";
import { webhookDeliveries } from "../../schema/webhooks.ts";
import { parseRetryAfterMs, retryDelayMs } from "../../lib/backoff.ts";
import { validateWebhookConfig } from "./config.ts";
import { forwardRequestHeaders } from "./forward-headers.ts";
import type { AuditEntry } from "../../schema/audit-log.ts";
import { withWebhookStore } from "./deps.ts";
import type { AttemptResult, ClaimedDelivery, Settlement } from "./store-types.ts";
import type { WebhookDeps } from "./types.ts";

export interface DeliveryWorker {
  /** Identifies this worker in leases and attempt rows. */
  readonly id: string;
  /** Polls for due deliveries until stopped (and runs at once whenever kicked). */
  start(): void;
  /** Stops claiming and resolves when the attempts in flight have finished. */
  stop(): Promise<void>;
  /** Claims what is due now (up to `concurrency`), attempts it, and resolves with how many it attempted. */
  runOnce(): Promise<number>;
  /** Something was queued: look now rather than at the next poll. */
  kick(): void;
}

/** Only this much of an agent's error answer is kept, as the attempt's error text. */
const errorSnippetBytes = 512;
/** Answers longer than this are cancelled rather than read to their end. */
const drainLimitBytes = 64 * 1024;
/** Requests to the agent name only a path: the host part is a placeholder the forwarder ignores. */
const agentOrigin = "http://agent.invalid";

/** Where a delivery goes: the endpoint's path; an operation's outcome to `<path>/<operation id>` (its external id). */
export function deliveryPath(endpoint: { path: string; scheme: string }, externalId: string): string {
  return endpoint.scheme === "operations" ? `${endpoint.path.replace(/\/+$/, "")}/${encodeURIComponent(externalId)}` : endpoint.path;
}

/**
 * `metrics`: every attempt is counted by its result (delivered, retry, dead), and while the worker runs, the queue's
 * depth is read from `deps.db` (when given) at each scrape.
 */
export function createDeliveryWorker(deps: WebhookDeps, opts: { workerId?: string; metrics?: Metrics } = {}): DeliveryWorker {
  const { store, clock, config, log } = withWebhookStore(deps);
  const metrics = opts.metrics ?? noopMetrics;
  let unregisterDepth: (() => void) | undefined;
  validateWebhookConfig(config);
  const random = deps.random ?? Math.random;
  const id = opts.workerId ?? `whw_${crypto.randomUUID().replaceAll("-", "").slice(0, 12)}`;
  const inFlight = new Set<Promise<void>>();
  let running = false;
  let claiming = false;
  let kickedWhileClaiming = false;
  let timer: { cancel(): void } | undefined;

  async function claim(limit: number): Promise<ClaimedDelivery[]> {
    return store.claimDue({ now: new Date(clock.now()), limit, leaseMs: config.leaseMs, workerId: id });
  }

  async function attempt(claim: ClaimedDelivery): Promise<void> {
    const { delivery, endpoint } = claim;
    const startedMono = clock.monotonic();
    let statusCode: number | null = null;
    let error: string | null = null;
    let retryAfterHintMs: number | undefined;

    if (claim.agentDeleted) {
      error = "the agent was deleted";
    } else {
      const abort = new AbortController();
      const deadline = clock.setTimeout(
        () => abort.abort(new AppError("gateway_timeout", `no answer within ${config.attemptTimeoutMs} ms`)),
        config.attemptTimeoutMs,
      );
      try {
        const req = new Request(new URL(deliveryPath(endpoint, delivery.externalId), agentOrigin), {
          method: "POST",
          headers: forwardRequestHeaders(delivery.headers, delivery.id, claim.attempt, claim.attemptRequestId),
          body: delivery.body as Uint8Array<ArrayBuffer>,
          signal: abort.signal,
        });
        const res = await raceAbort(deps.forward(delivery.agentId, req, { requestId: claim.attemptRequestId, reason: "webhook" }), abort.signal);
        statusCode = res.status;
        if (res.status >= 200 && res.status <= 299) {
          // Delivered once the agent accepted it; its answer is read (to release the agent's stream) but not judged.
          await drain(res, abort.signal).catch(() => {});
        } else {
          const snippet = await drain(res, abort.signal);
          error = `agent answered ${res.status}${snippet ? `: ${snippet}` : ""}`;
          retryAfterHintMs = parseRetryAfterMs(res.headers.get("retry-after"), clock.now());
        }
      } catch (err) {
        const appErr = err instanceof AppError ? err : abort.signal.aborted && abort.signal.reason instanceof AppError ? abort.signal.reason : undefined;
        error = appErr ? `${appErr.code}: ${appErr.message}` : `forward failed: ${err instanceof Error ? err.message : String(err)}`;
        if (appErr?.retryAfterS !== undefined) retryAfterHintMs = appErr.retryAfterS * 1000;
      } finally {
        deadline.cancel();
      }
    }

    const finishedAt = new Date(clock.now());
    const ok = error === null;
    const result: AttemptResult = {
      outcome: ok ? "ok" : statusCode !== null ? "http_error" : "error",
      statusCode,
      error,
      durationMs: Math.max(0, Math.round(clock.monotonic() - startedMono)),
      finishedAt,
    };
    const exhausted = claim.agentDeleted || delivery.roundAttempts >= config.maxAttempts;
    const settlement: Settlement = ok
      ? { status: "delivered" }
      : exhausted
        ? { status: "dead" }
        : { status: "pending", nextAttemptAt: new Date(finishedAt.getTime() + retryDelayMs(delivery.roundAttempts, config, random(), retryAfterHintMs)) };
    const audit: AuditEntry | undefined =
      settlement.status === "pending"
        ? undefined
        : {
            tenantId: delivery.tenantId,
            actor: `webhook-worker:${id}`,
            action: settlement.status === "delivered" ? "webhook.delivery.delivered" : "webhook.delivery.dead_lettered",
            target: delivery.id,
            requestId: claim.attemptRequestId,
            detail: { agentId: delivery.agentId, endpointId: endpoint.id, endpoint: endpoint.name, attempt: claim.attempt, statusCode, error },
          };
    const settled = await store.recordAttempt(claim, result, settlement, audit);
    if (settled) metrics.inc("agentvm_webhook_attempts_total", { result: settlement.status === "pending" ? "retry" : settlement.status });
    const fields = {
      deliveryId: delivery.id,
      agentId: delivery.agentId,
      attempt: claim.attempt,
      statusCode,
      durationMs: result.durationMs,
      requestId: claim.attemptRequestId,
    };
    if (!settled) log.warn("webhook attempt finished after its lease was taken over; outcome not recorded on the delivery", { ...fields, error });
    else if (settlement.status === "delivered") log.info("webhook delivered", fields);
    else if (settlement.status === "dead") log.warn("webhook dead-lettered", { ...fields, error });
    else log.info("webhook attempt failed; will retry", { ...fields, error, nextAttemptAt: settlement.nextAttemptAt.toISOString() });
  }

  function track(claimed: ClaimedDelivery): Promise<void> {
    const p = attempt(claimed)
      .catch((err: unknown) => {
        // The lease expires and another claim retries it: at-least-once holds even when recording the outcome failed.
        log.error("webhook attempt could not be recorded", { deliveryId: claimed.delivery.id, err: err instanceof Error ? err : String(err) });
      })
      .finally(() => {
        inFlight.delete(p);
        if (running) schedule(0);
      });
    inFlight.add(p);
    return p;
  }

  function schedule(ms: number): void {
    timer?.cancel();
    timer = clock.setTimeout(() => void tick(), ms);
  }

  async function tick(): Promise<void> {
    timer = undefined;
    if (!running) return;
    if (claiming) {
      kickedWhileClaiming = true;
      return;
    }
    const free = config.concurrency - inFlight.size;
    if (free <= 0) return; // a finishing attempt schedules the next tick
    claiming = true;
    kickedWhileClaiming = false;
    let claimed: ClaimedDelivery[] = [];
    try {
      claimed = await claim(free);
    } catch (err) {
      log.error("claiming webhook deliveries failed", { err: err instanceof Error ? err : String(err) });
    } finally {
      claiming = false;
    }
    for (const c of claimed) track(c);
    if (!running) return;
    // A full batch means more may be due; otherwise wait for the poll (or a kick).
    schedule(claimed.length === free || kickedWhileClaiming ? 0 : config.pollIntervalMs);
  }

  return {
    id,
    start() {
      if (running) return;
      running = true;
      const { db } = deps;
      if (db) unregisterDepth = metrics.gauge("agentvm_webhook_queue_depth", () => queueDepth(db));
      schedule(0);
    },
    async stop() {
      running = false;
      unregisterDepth?.();
      unregisterDepth = undefined;
      timer?.cancel();
      timer = undefined;
      await Promise.allSettled([...inFlight]);
    },
    async runOnce() {
      const claimed = await claim(config.concurrency);
      await Promise.all(claimed.map(track));
      return claimed.length;
    },
    kick() {
      if (!running) return;
      // A claim under way may have looked before this delivery was stored: make its end schedule another at once
      // (its own schedule would otherwise replace the kick's timer with the poll interval).
      if (claiming) kickedWhileClaiming = true;
      schedule(0);
    },
  };
}

/** Deliveries not settled yet: due, waiting for a retry, or in flight (the due index covers exactly these). */
async function queueDepth(db: Db): Promise<number> {
  const [row] = await db
    .select({ n: count() })
    .from(webhookDeliveries)
    .where(inArray(webhookDeliveries.status, ["pending", "in_flight"]));
  return row?.n ?? 0;
}

/** Rejects with the abort reason when `signal` fires first (a forwarder that ignores the request's signal still times out). */
function raceAbort<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/**
 * Reads an answer to its end (so the stream and the agent's in-flight slot are released the normal way) and
 * returns its first bytes as text, for an attempt's error. Cancels it when it is longer than `drainLimitBytes`.
 */
async function drain(res: Response, signal: AbortSignal): Promise<string> {
  if (!res.body) return "";
  const reader = res.body.getReader();
  const kept: Uint8Array[] = [];
  let keptBytes = 0;
  let total = 0;
  let ended = false;
  try {
    while (total <= drainLimitBytes) {
      const { done, value } = await raceAbort(reader.read(), signal);
      if (done) {
        ended = true;
        break;
      }
      total += value.byteLength;
      if (keptBytes < errorSnippetBytes) {
        const part = value.subarray(0, errorSnippetBytes - keptBytes);
        kept.push(part);
        keptBytes += part.byteLength;
      }
    }
  } finally {
    if (!ended) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
  const bytes = new Uint8Array(keptBytes);
  let at = 0;
  for (const part of kept) {
    bytes.set(part, at);
    at += part.byteLength;
  }
  return new TextDecoder().decode(bytes).trim();
}
