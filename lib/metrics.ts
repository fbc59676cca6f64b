// The metrics port the logic calls (one catalogue of every metric: name, help, labels, buckets) and the one that does nothing.
//
// Counters and histograms are fed as things happen (`inc`, `observe`); gauges that are states (awake VMs, spool
// depth, queue depth) are read when scraped (`gauge(name, collect)`), so nothing is counted twice and nothing drifts.
// The Prometheus implementation is lib/node-metrics.ts; names follow Prometheus conventions (`agentvm_` prefix, the
// unit in the name, `_total` on counters, base units: seconds and bytes).

/** Wake phases: from a few milliseconds (a warm restore) to a minute (a cold boot at the wake deadline), seconds. */
const wakeBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60] as const;
/** Fixing a restored guest's clock: well under a second, seconds. */
const clockFixBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1] as const;
/** A doze, from the pause to the resume: a model's first token in tens of ms to a long tool call, capped by DOZE_MAX_MS, seconds. */
const dozeBuckets = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120] as const;
/** Writing a snapshot: a frozen process in milliseconds, a VM's memory in seconds, seconds. */
const snapshotBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120] as const;

export const metricCatalogue = {
  agentvm_wakes_total: {
    type: "counter",
    help: "Wakes of agents' VMs that completed, by mode (boot, restore) and reason (request, webhook, api, boot)",
    labels: ["mode", "reason"],
  },
  agentvm_wake_failures_total: {
    type: "counter",
    help: "Wakes that failed, by reason and error code (boot_failed: the image did not come up; wake_failed: the rest)",
    labels: ["reason", "code"],
  },
  agentvm_wake_seconds: {
    type: "histogram",
    help: "Whole wake, from its start to the VM running and reachable, by mode",
    labels: ["mode"],
    buckets: wakeBuckets,
  },
  agentvm_wake_queue_seconds: {
    type: "histogram",
    help: "How long a call waited for its agent's wake (behind it, the wake included), one observation per waiting call, by mode",
    labels: ["mode"],
    buckets: wakeBuckets,
  },
  agentvm_wake_restore_seconds: { type: "histogram", help: "Restoring a VM from its snapshot (restore wakes)", labels: [], buckets: wakeBuckets },
  agentvm_wake_boot_seconds: {
    type: "histogram",
    help: "Cold boot of a VM until its agent answers (boot wakes, a failed restore's fallback included)",
    labels: [],
    buckets: wakeBuckets,
  },
  agentvm_wake_clock_fix_seconds: { type: "histogram", help: "Setting a restored guest's clock to the host's", labels: [], buckets: clockFixBuckets },
  agentvm_wake_first_byte_seconds: {
    type: "histogram",
    help: "From a wake's start to the first response byte of the call it woke for, by mode",
    labels: ["mode"],
    buckets: wakeBuckets,
  },
  agentvm_proxied_calls_total: {
    type: "counter",
    help: "Calls proxied to agents (WebSocket upgrades included), by the class of the status answered (1xx…5xx; aborted: the client left before an answer)",
    labels: ["status_class"],
  },
  agentvm_snapshot_bytes_total: { type: "counter", help: "Bytes written by hibernations (snapshots of VMs' memory and state)", labels: [] },
  agentvm_snapshot_seconds: {
    type: "histogram",
    help: "Writing one hibernation's snapshot, by reason (idle, api, shutdown)",
    labels: ["reason"],
    buckets: snapshotBuckets,
  },
  agentvm_hibernate_failures_total: { type: "counter", help: "Hibernations whose snapshot could not be written (the VM stayed awake)", labels: [] },
  agentvm_vms_awake: {
    type: "gauge",
    help: "VMs awake on this process's hosts (running, or writing their snapshot; a dozing VM is not: its vCPUs are stopped)",
    labels: [],
  },
  agentvm_vms_dozing: {
    type: "gauge",
    help: "VMs dozing on this process's hosts: vCPUs stopped while every call they have open waits on an outbound call (memory and connections kept)",
    labels: [],
  },
  agentvm_dozes_total: { type: "counter", help: "Dozes begun (a running VM's vCPUs stopped while its calls waited on outbound calls)", labels: [] },
  agentvm_doze_seconds: {
    type: "histogram",
    help: "How long a doze lasted, from the pause to the resume, by what resumed it (upstream, request, webhook, api, doze_max)",
    labels: ["reason"],
    buckets: dozeBuckets,
  },
  agentvm_doze_failures_total: {
    type: "counter",
    help: "Pauses that failed (the VM kept running) and resumes that failed (the VM was ended as a crash), by step",
    labels: ["step"],
  },
  agentvm_vms_hibernated: { type: "gauge", help: "VMs hibernated on this process's hosts (among the agents they have served since they started)", labels: [] },
  agentvm_meter_spool_segments: { type: "gauge", help: "Meter segments spooled on disk and not yet acknowledged by billing", labels: [] },
  agentvm_meter_shipping_lag_seconds: {
    type: "gauge",
    help: "Age of the oldest spooled meter segment billing has not acknowledged (from its end); 0 when none waits",
    labels: [],
  },
  agentvm_meter_ship_failures_total: { type: "counter", help: "Meter shipments to billing that failed (retried with backoff)", labels: [] },
  agentvm_billing_overlap_segments_total: {
    type: "counter",
    help: "Meter segments billing stored but clipped: part or all of their time was already billed for their agent (another host's segment)",
    labels: [],
  },
  agentvm_billing_overlap_seconds_total: {
    type: "counter",
    help: "Metered time not billed because another segment of the same agent (any host) had already billed it, seconds",
    labels: [],
  },
  agentvm_webhook_queue_depth: { type: "gauge", help: "Webhook deliveries pending or in flight (due now or waiting for a retry)", labels: [] },
  agentvm_webhook_attempts_total: {
    type: "counter",
    help: "Webhook delivery attempts, by result (delivered; retry: failed and scheduled again; dead: failed for the last time)",
    labels: ["result"],
  },
} as const satisfies Record<string, MetricSpec>;

export type MetricSpec =
  | { type: "counter" | "gauge"; help: string; labels: readonly string[] }
  | { type: "histogram"; help: string; labels: readonly string[]; buckets: readonly number[] };

type Catalogue = typeof metricCatalogue;
export type MetricName = keyof Catalogue;
type NamesOf<T extends MetricSpec["type"]> = { [K in MetricName]: Catalogue[K]["type"] extends T ? K : never }[MetricName];
export type CounterName = NamesOf<"counter">;
export type HistogramName = NamesOf<"histogram">;
export type GaugeName = NamesOf<"gauge">;
/** The label values a metric takes: `{}` for one without labels. */
export type LabelsOf<K extends MetricName> = { [L in Catalogue[K]["labels"][number]]: string };

export interface Metrics {
  /** Adds `by` (default 1) to a counter. */
  inc<K extends CounterName>(name: K, labels: LabelsOf<K>, by?: number): void;
  /** A counter with its labels fixed, for hot paths: `inc` then neither allocates nor hashes labels. */
  counter<K extends CounterName>(name: K, labels: LabelsOf<K>): { inc(by?: number): void };
  /** One observation of a histogram, in the metric's unit (seconds, bytes). */
  observe<K extends HistogramName>(name: K, labels: LabelsOf<K>, value: number): void;
  /**
   * A gauge read at scrape time. Callbacks registered under one name add up (several hosts in one process); one
   * that throws makes the gauge NaN for that scrape. Returns the way to unregister it.
   */
  gauge(name: GaugeName, collect: () => number | Promise<number>): () => void;
}

/** Metrics nowhere: the default of every component (tests, the Worker). */
const noopCounter = { inc() {} };

export const noopMetrics: Metrics = {
  inc() {},
  counter: () => noopCounter,
  observe() {},
  gauge: () => () => {},
};

const callCounters = new WeakMap<Metrics, (status: number | undefined) => void>();

/**
 * Counts a proxied call by the class of the status it was answered with (`2xx` for a 204; undefined or 0: `aborted`,
 * the client left before an answer). Its counters are bound once per `metrics`: a call allocates nothing here.
 */
export function proxiedCalls(metrics: Metrics): (status: number | undefined) => void {
  let count = callCounters.get(metrics);
  if (!count) {
    const byHundred = ["1xx", "2xx", "3xx", "4xx", "5xx"].map((c) => metrics.counter("agentvm_proxied_calls_total", { status_class: c }));
    const aborted = metrics.counter("agentvm_proxied_calls_total", { status_class: "aborted" });
    count = (status) => (status !== undefined && status >= 100 && status < 600 ? byHundred[Math.floor(status / 100) - 1]! : aborted).inc();
    callCounters.set(metrics, count);
  }
  return count;
}

/** Milliseconds as the seconds a metric takes. */
export function seconds(ms: number): number {
  return ms / 1000;
}
