// What the webhook module is built from: its store (or the database for one), clock, logger, the gateway's wake-and-forward path, and its limits.
import type { Db } from "../../schema/db.ts";
import type { Clock } from "../../lib/clock.ts";
import type { Logger } from "../../lib/log.ts";
import type { WebhookStore } from "./store-types.ts";

export interface WebhookConfig {
  /** Largest body accepted at intake (413 above it). */
  maxBodyBytes: number;
  /** Standard Webhooks timestamps further than this from now, either way, are refused (401). */
  toleranceS: number;
  /** Per-endpoint intake rate (token bucket; a full minute's worth may arrive as one burst). */
  ratePerMinute: number;
  /** Attempts per delivery round before it is dead-lettered. */
  maxAttempts: number;
  /** Retry delay before attempt n+1 is `min(backoffMaxMs, backoffBaseMs · 2^(n-1))`, then jittered to 50–100 %. */
  backoffBaseMs: number;
  backoffMaxMs: number;
  /** One attempt (wake + forward + reading the answer) is aborted after this long. */
  attemptTimeoutMs: number;
  /** A claimed delivery belongs to its worker this long; after it another worker may take it over. */
  leaseMs: number;
  /** How often an idle worker looks for due deliveries (it is also kicked by intake in the same process). */
  pollIntervalMs: number;
  /** Deliveries one worker attempts at the same time. */
  concurrency: number;
  /** Overlap of a rotation when the request names none. */
  defaultRotationOverlapS: number;
}

export const defaultWebhookConfig: WebhookConfig = {
  maxBodyBytes: 1024 * 1024,
  toleranceS: 300,
  ratePerMinute: 600,
  maxAttempts: 8,
  backoffBaseMs: 1_000,
  backoffMaxMs: 10 * 60_000,
  attemptTimeoutMs: 60_000,
  leaseMs: 120_000,
  pollIntervalMs: 1_000,
  concurrency: 16,
  defaultRotationOverlapS: 24 * 3600,
};

export interface ForwardContext {
  requestId: string;
  reason: "webhook";
}

interface WebhookDepsCommon {
  clock: Clock;
  log: Logger;
  /**
   * Wakes the agent through the normal path (wake reason "webhook") and forwards the request; resolves with the
   * agent's response (body streamed). Throws AppError (wake_failed/queue_full/bad_gateway/...) on failure.
   */
  forward(agentId: string, req: Request, ctx: ForwardContext): Promise<Response>;
  config: WebhookConfig;
  /** Source of jitter in [0, 1); injected so tests can pin it. Defaults to Math.random. */
  random?: () => number;
}

/** The store of endpoints and deliveries, or the database to keep them in (the Postgres store, auditing there). */
type WebhookStorage = { store: WebhookStore; db?: Db } | { db: Db; store?: undefined };

export type WebhookDeps = WebhookDepsCommon & WebhookStorage;

/** The deps with their store settled (see `withWebhookStore`): what the routes and the delivery worker run on. */
export type ResolvedWebhookDeps = WebhookDepsCommon & { store: WebhookStore };
