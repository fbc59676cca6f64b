// The metrics port: its catalogue renders as Prometheus text, the noop does nothing, buckets are sane, gauges are read
// at scrape time, proxied calls are counted by status class, and GET /metrics answers only with its token.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { metricCatalogue, noopMetrics, proxiedCalls, type MetricName } from "../../lib/metrics.ts";
import { createNodeMetrics } from "../../lib/node-metrics.ts";
import { metricsResponse } from "../../lib/metrics-endpoint.ts";
import { AppError } from "../../lib/errors.ts";
import { parseMetricsToken, randomMetricsToken } from "../../compose/metrics.ts";

/** The value of one sample line (`name{labels} value`), undefined when absent. */
function sample(text: string, series: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

const names = Object.keys(metricCatalogue) as MetricName[];

describe("the catalogue", () => {
  it("follows Prometheus conventions: agentvm_ prefix, _total on counters only, a unit on histograms", () => {
    for (const name of names) {
      const spec = metricCatalogue[name];
      expect(name).toMatch(/^agentvm_[a-z0-9_]+$/);
      expect(spec.help.length).toBeGreaterThan(10);
      if (spec.type === "counter") expect(name).toMatch(/_total$/);
      else expect(name).not.toMatch(/_total$/);
      if (spec.type === "histogram") expect(name).toMatch(/_(seconds|bytes)$/);
      for (const label of spec.labels) expect(label).toMatch(/^[a-z_]+$/);
    }
  });

  it("histogram buckets are positive, strictly increasing, and span what they measure", () => {
    for (const name of names) {
      const spec = metricCatalogue[name];
      if (spec.type !== "histogram") continue;
      const b = spec.buckets;
      expect(b.length).toBeGreaterThanOrEqual(8);
      expect(b[0]).toBeGreaterThan(0);
      for (let i = 1; i < b.length; i++) expect(b[i]).toBeGreaterThan(b[i - 1]!);
    }
    // A warm restore (milliseconds) and a cold boot at the default wake deadline (60 s) both land inside the range.
    const wake = metricCatalogue.agentvm_wake_seconds.buckets;
    expect(wake[0]).toBeLessThanOrEqual(0.005);
    expect(wake[wake.length - 1]).toBeGreaterThanOrEqual(60);
    expect(metricCatalogue.agentvm_wake_clock_fix_seconds.buckets[0]).toBeLessThanOrEqual(0.001);
  });

  it("renders every metric of the catalogue with its help and type, beside Node's process metrics", async () => {
    const m = createNodeMetrics();
    const text = await m.metricsText();
    for (const name of names) {
      const spec = metricCatalogue[name];
      expect(text).toContain(`# HELP ${name} ${spec.help}`);
      expect(text).toContain(`# TYPE ${name} ${spec.type}`);
    }
    expect(text).toMatch(/^process_cpu_user_seconds_total /m);
    expect(text).toMatch(/^nodejs_eventloop_lag_seconds /m);
    expect(m.contentType).toMatch(/^text\/plain; version=0\.0\.4/);
  });

  it("leaves an idle process idle: the event loop's delay is sampled 10 times a second, not prom-client's 100", () => {
    // The main thread's voluntary context switches over 2 s of an idle process with the registry (a count, not a time).
    const script = `
      import { readFileSync } from "node:fs";
      import { createNodeMetrics } from ${JSON.stringify(fileURLToPath(new URL("../../lib/node-metrics.ts", import.meta.url)))};
      createNodeMetrics();
      const switches = () => Number(/^voluntary_ctxt_switches:\\s+(\\d+)/m.exec(readFileSync("/proc/self/status", "utf8"))[1]);
      setTimeout(() => {
        const before = switches();
        setTimeout(() => console.log(String((switches() - before) / 2)), 2000);
      }, 300);`;
    const perSecond = Number(execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" }).trim());
    expect(perSecond).toBeGreaterThan(5); // the sampling runs
    expect(perSecond).toBeLessThan(30);
  });

  it("two registries do not see each other's counts (not prom-client's global registry)", async () => {
    const a = createNodeMetrics({ processMetrics: false });
    const b = createNodeMetrics({ processMetrics: false });
    a.inc("agentvm_wakes_total", { mode: "boot", reason: "request" });
    expect(sample(await a.metricsText(), 'agentvm_wakes_total{mode="boot",reason="request"}')).toBe(1);
    expect(sample(await b.metricsText(), 'agentvm_wakes_total{mode="boot",reason="request"}')).toBeUndefined();
  });
});

describe("the prom-client implementation", () => {
  it("counts, observes into the right buckets, and binds counters for hot paths", async () => {
    const m = createNodeMetrics({ processMetrics: false });
    m.inc("agentvm_snapshot_bytes_total", {}, 4096);
    m.inc("agentvm_snapshot_bytes_total", {}, 1024);
    m.observe("agentvm_wake_seconds", { mode: "restore" }, 0.03);
    m.observe("agentvm_wake_seconds", { mode: "restore" }, 2);
    const bound = m.counter("agentvm_webhook_attempts_total", { result: "retry" });
    bound.inc();
    bound.inc(2);
    const text = await m.metricsText();
    expect(sample(text, "agentvm_snapshot_bytes_total")).toBe(5120);
    expect(sample(text, 'agentvm_wake_seconds_bucket{le="0.025",mode="restore"}')).toBe(0);
    expect(sample(text, 'agentvm_wake_seconds_bucket{le="0.05",mode="restore"}')).toBe(1);
    expect(sample(text, 'agentvm_wake_seconds_bucket{le="2.5",mode="restore"}')).toBe(2);
    expect(sample(text, 'agentvm_wake_seconds_count{mode="restore"}')).toBe(2);
    expect(sample(text, 'agentvm_wake_seconds_sum{mode="restore"}')).toBeCloseTo(2.03);
    expect(sample(text, 'agentvm_webhook_attempts_total{result="retry"}')).toBe(3);
  });

  it("gauges are read at scrape time: callbacks add up, a failing one makes NaN, unregistering removes it", async () => {
    const m = createNodeMetrics({ processMetrics: false });
    let awake = 2;
    const one = m.gauge("agentvm_vms_awake", () => awake);
    m.gauge("agentvm_vms_awake", async () => 3);
    expect(sample(await m.metricsText(), "agentvm_vms_awake")).toBe(5);
    awake = 7;
    expect(sample(await m.metricsText(), "agentvm_vms_awake")).toBe(10);
    one();
    expect(sample(await m.metricsText(), "agentvm_vms_awake")).toBe(3);
    m.gauge("agentvm_webhook_queue_depth", () => Promise.reject(new Error("database down")));
    expect(sample(await m.metricsText(), "agentvm_webhook_queue_depth")).toBeNaN();
  });

  it("proxied calls are counted by status class; no answer counts as aborted", async () => {
    const m = createNodeMetrics({ processMetrics: false });
    const count = proxiedCalls(m);
    expect(proxiedCalls(m)).toBe(count); // bound once per registry
    for (const status of [101, 200, 204, 299, 302, 404, 429, 500, 503, 599, undefined, 0]) count(status);
    const text = await m.metricsText();
    const of = (c: string) => sample(text, `agentvm_proxied_calls_total{status_class="${c}"}`);
    expect([of("1xx"), of("2xx"), of("3xx"), of("4xx"), of("5xx"), of("aborted")]).toEqual([1, 3, 1, 2, 3, 2]);
  });
});

describe("noopMetrics", () => {
  it("does nothing and needs nothing", () => {
    noopMetrics.inc("agentvm_wakes_total", { mode: "boot", reason: "api" });
    noopMetrics.observe("agentvm_wake_seconds", { mode: "boot" }, 1);
    noopMetrics.counter("agentvm_proxied_calls_total", { status_class: "2xx" }).inc();
    let read = 0;
    const unregister = noopMetrics.gauge("agentvm_vms_awake", () => ++read);
    unregister();
    proxiedCalls(noopMetrics)(200);
    expect(read).toBe(0); // never scraped, never read
  });
});

describe("GET /metrics", () => {
  const endpoint = { token: "s3cret-metrics-token", text: async () => "agentvm_vms_awake 1\n", contentType: "text/plain; version=0.0.4; charset=utf-8" };
  const refusal = async (p: Promise<unknown>) => {
    const err = await p.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(AppError);
    return { code: (err as AppError).code, message: (err as AppError).message };
  };

  it("answers the text with the token, 401 without it or with another, 404 when metrics are off", async () => {
    const ok = await metricsResponse(endpoint, "Bearer s3cret-metrics-token");
    expect(ok.status).toBe(200);
    expect(ok.headers.get("content-type")).toBe(endpoint.contentType);
    expect(await ok.text()).toBe("agentvm_vms_awake 1\n");
    expect((await metricsResponse(endpoint, "bearer s3cret-metrics-token")).status).toBe(200);
    for (const header of [undefined, "", "Bearer", "Bearer s3cret-metrics-tokeN", "Bearer s3cret-metrics-token2", "Basic s3cret-metrics-token"]) {
      expect((await refusal(metricsResponse(endpoint, header))).code).toBe("unauthorized");
    }
    expect(await refusal(metricsResponse({ ...endpoint, token: undefined }, "Bearer s3cret-metrics-token"))).toEqual({
      code: "not_found",
      message: "metrics are off: set METRICS_TOKEN",
    });
    expect((await refusal(metricsResponse(undefined, undefined))).code).toBe("not_found");
  });

  it("METRICS_TOKEN: unset is off, too short is refused at start, a generated one is 32 hex characters", () => {
    expect(parseMetricsToken({})).toBeUndefined();
    expect(parseMetricsToken({ METRICS_TOKEN: "" })).toBeUndefined();
    expect(parseMetricsToken({ METRICS_TOKEN: "0123456789abcdef" })).toBe("0123456789abcdef");
    expect(() => parseMetricsToken({ METRICS_TOKEN: "short" })).toThrow(/METRICS_TOKEN must be at least 16 characters/);
    expect(() => parseMetricsToken({ METRICS_TOKEN: "with a space inside it" })).toThrow(/without spaces/);
    const a = randomMetricsToken();
    expect(a).toMatch(/^[0-9a-f]{32}$/);
    expect(randomMetricsToken()).not.toBe(a);
  });
});
