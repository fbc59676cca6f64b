// The webhook module's variables (one zod fragment) and its limits built from them at a program's edge.
import { z } from "zod";
import { AppError } from "../../lib/errors.ts";
import { parseEnv, vars, type Env } from "../../lib/env.ts";
import { defaultWebhookConfig as d, type WebhookConfig } from "./types.ts";

export const webhookEnv = z.object({
  WEBHOOK_MAX_BODY_BYTES: vars.int({ fallback: d.maxBodyBytes, min: 1, max: 64 * 1024 * 1024, unit: "bytes", doc: "largest accepted webhook body" }),
  WEBHOOK_TOLERANCE_S: vars.int({
    fallback: d.toleranceS,
    min: 1,
    max: 86_400,
    unit: "s",
    doc: "allowed distance of `webhook-timestamp` from now, either way",
  }),
  WEBHOOK_RATE_PER_MINUTE: vars.int({
    fallback: d.ratePerMinute,
    min: 1,
    max: 1_000_000,
    unit: "deliveries/min",
    doc: "per endpoint; a minute's worth may arrive as one burst",
  }),
  WEBHOOK_MAX_ATTEMPTS: vars.int({ fallback: d.maxAttempts, min: 1, max: 100, doc: "attempts before the dead letter (per redelivery)" }),
  WEBHOOK_BACKOFF_BASE_MS: vars.int({ fallback: d.backoffBaseMs, min: 1, unit: "ms", doc: "retry delay: the first step" }),
  WEBHOOK_BACKOFF_MAX_MS: vars.int({ fallback: d.backoffMaxMs, min: 1, unit: "ms", doc: "retry delay: the ceiling (≥ `WEBHOOK_BACKOFF_BASE_MS`)" }),
  WEBHOOK_ATTEMPT_TIMEOUT_MS: vars.int({ fallback: d.attemptTimeoutMs, min: 100, unit: "ms", doc: "one attempt, wake included" }),
  WEBHOOK_LEASE_MS: vars.int({
    fallback: d.leaseMs,
    min: 100,
    unit: "ms",
    doc: "after this, another gateway may take over a claimed delivery (must exceed `WEBHOOK_ATTEMPT_TIMEOUT_MS`)",
  }),
  WEBHOOK_POLL_INTERVAL_MS: vars.int({
    fallback: d.pollIntervalMs,
    min: 10,
    unit: "ms",
    doc: "how often an idle worker looks for due deliveries (intake in the same process kicks it at once)",
  }),
  WEBHOOK_CONCURRENCY: vars.int({ fallback: d.concurrency, min: 1, max: 1_000, doc: "attempts one gateway runs at the same time" }),
  WEBHOOK_ROTATION_OVERLAP_S: vars.int({
    fallback: d.defaultRotationOverlapS,
    min: 0,
    max: 30 * 86_400,
    unit: "s",
    doc: "overlap of a secret rotation that names none",
  }),
});

export type WebhookSettings = z.output<typeof webhookEnv>;

/** The webhook module's limits from its parsed variables; refuses the combinations that cannot work. */
export function webhookConfigOf(v: WebhookSettings): WebhookConfig {
  const config: WebhookConfig = {
    maxBodyBytes: v.WEBHOOK_MAX_BODY_BYTES,
    toleranceS: v.WEBHOOK_TOLERANCE_S,
    ratePerMinute: v.WEBHOOK_RATE_PER_MINUTE,
    maxAttempts: v.WEBHOOK_MAX_ATTEMPTS,
    backoffBaseMs: v.WEBHOOK_BACKOFF_BASE_MS,
    backoffMaxMs: v.WEBHOOK_BACKOFF_MAX_MS,
    attemptTimeoutMs: v.WEBHOOK_ATTEMPT_TIMEOUT_MS,
    leaseMs: v.WEBHOOK_LEASE_MS,
    pollIntervalMs: v.WEBHOOK_POLL_INTERVAL_MS,
    concurrency: v.WEBHOOK_CONCURRENCY,
    defaultRotationOverlapS: v.WEBHOOK_ROTATION_OVERLAP_S,
  };
  validateWebhookConfig(config);
  return config;
}

/** The webhook module's limits from these variables alone (tests, the API document). */
export function webhookConfigFromEnv(env: Env): WebhookConfig {
  return webhookConfigOf(parseEnv(webhookEnv, env));
}

/** A lease shorter than an attempt would let a second worker start while the first is still forwarding. */
export function validateWebhookConfig(config: WebhookConfig): void {
  if (config.leaseMs <= config.attemptTimeoutMs) {
    throw new AppError(
      "bad_request",
      `configuration: WEBHOOK_LEASE_MS (${config.leaseMs}) must exceed WEBHOOK_ATTEMPT_TIMEOUT_MS (${config.attemptTimeoutMs})`,
    );
  }
  if (config.backoffMaxMs < config.backoffBaseMs) {
    throw new AppError(
      "bad_request",
      `configuration: WEBHOOK_BACKOFF_MAX_MS (${config.backoffMaxMs}) must be ≥ WEBHOOK_BACKOFF_BASE_MS (${config.backoffBaseMs})`,
    );
  }
}
