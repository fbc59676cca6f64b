// The programs' metrics settings: METRICS_TOKEN (its variable, parsed at the edge), and the one registry a process serves at GET /metrics.
import { z } from "zod";
import { envVar, parseEnv, type Env } from "../lib/env.ts";
import type { MetricsEndpoint } from "../lib/metrics-endpoint.ts";
import { noopMetrics, type Metrics } from "../lib/metrics.ts";
import { createNodeMetrics } from "../lib/node-metrics.ts";

/** The shortest METRICS_TOKEN accepted: a scrape credential, not a password to remember. */
const minTokenChars = 16;

export const metricsEnv = z.object({
  METRICS_TOKEN: envVar(
    {
      type: "secret",
      default: "(unset: metrics are off, `GET /metrics` answers 404; `npm start` makes a random one and prints it)",
      doc: `bearer token of \`GET /metrics\` (Prometheus text) on the gateway's listener and on each host's ingress, ≥ ${minTokenChars} characters, no spaces`,
    },
    (raw, fail) => {
      if (raw === undefined || raw === "") return undefined;
      if (raw.length < minTokenChars || /\s/.test(raw)) fail(`must be at least ${minTokenChars} characters without spaces`);
      return raw;
    },
  ),
});

/** METRICS_TOKEN alone. */
export function parseMetricsToken(env: Env): string | undefined {
  return parseEnv(metricsEnv, env).METRICS_TOKEN;
}

/** A fresh METRICS_TOKEN (`npm start` without one): 32 hex characters. */
export function randomMetricsToken(): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

/** What a process counts into and serves: a prom-client registry when metrics are on, nothing (`noopMetrics`) when off. */
export interface ProcessMetrics {
  metrics: Metrics;
  endpoint: MetricsEndpoint;
}

export function processMetrics(token: string | undefined): ProcessMetrics {
  if (token === undefined) return { metrics: noopMetrics, endpoint: { token: undefined, text: async () => "", contentType: "text/plain" } };
  const registry = createNodeMetrics();
  return { metrics: registry, endpoint: { token, text: () => registry.metricsText(), contentType: registry.contentType } };
}
