// Reads the webhook module's limits from the environment (called once at a program's edge).
import { AppError } from "../../lib/errors.ts";
import { int, type Env } from "../../lib/env.ts";
import { defaultWebhookConfig as d, type WebhookConfig } from "./types.ts";

export function webhookConfigFromEnv(env: Env): WebhookConfig {
  const config: WebhookConfig = {
    maxBodyBytes: int(env, "WEBHOOK_MAX_BODY_BYTES", d.maxBodyBytes, { min: 1, max: 64 * 1024 * 1024 }),
    toleranceS: int(env, "WEBHOOK_TOLERANCE_S", d.toleranceS, { min: 1, max: 86_400 }),
    ratePerMinute: int(env, "WEBHOOK_RATE_PER_MINUTE", d.ratePerMinute, { min: 1, max: 1_000_000 }),
    maxAttempts: int(env, "WEBHOOK_MAX_ATTEMPTS", d.maxAttempts, { min: 1, max: 100 }),
    backoffBaseMs: int(env, "WEBHOOK_BACKOFF_BASE_MS", d.backoffBaseMs, { min: 1 }),
    backoffMaxMs: int(env, "WEBHOOK_BACKOFF_MAX_MS", d.backoffMaxMs, { min: 1 }),
    attemptTimeoutMs: int(env, "WEBHOOK_ATTEMPT_TIMEOUT_MS", d.attemptTimeoutMs, { min: 100 }),
    leaseMs: int(env, "WEBHOOK_LEASE_MS", d.leaseMs, { min: 100 }),
    pollIntervalMs: int(env, "WEBHOOK_POLL_INTERVAL_MS", d.pollIntervalMs, { min: 10 }),
    concurrency: int(env, "WEBHOOK_CONCURRENCY", d.concurrency, { min: 1, max: 1_000 }),
    defaultRotationOverlapS: int(env, "WEBHOOK_ROTATION_OVERLAP_S", d.defaultRotationOverlapS, { min: 0, max: 30 * 86_400 }),
  };
  validateWebhookConfig(config);
  return config;
}

/** A lease shorter than an attempt would let a second worker start while the first is still forwarding. */
export function validateWebhookConfig(config: WebhookConfig): void {
  if (config.leaseMs <= config.attemptTimeoutMs) {
    throw new AppError("bad_request", `configuration: WEBHOOK_LEASE_MS (${config.leaseMs}) must exceed WEBHOOK_ATTEMPT_TIMEOUT_MS (${config.attemptTimeoutMs})`);
  }
  if (config.backoffMaxMs < config.backoffBaseMs) {
    throw new AppError("bad_request", `configuration: WEBHOOK_BACKOFF_MAX_MS (${config.backoffMaxMs}) must be ≥ WEBHOOK_BACKOFF_BASE_MS (${config.backoffBaseMs})`);
  }
}
