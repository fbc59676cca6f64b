// Webhook policies without I/O: rate limit, retry backoff, body limit, which headers are kept and forwarded, config.
import { describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import { decideRate } from "../../gateway/webhooks/rate-limit.ts";
import { parseRetryAfterMs, retryDelayMs } from "../../lib/backoff.ts";
import { readBodyLimited } from "../../lib/body.ts";
import { forwardRequestHeaders, headersToStore } from "../../gateway/webhooks/forward-headers.ts";
import { webhookConfigFromEnv } from "../../gateway/webhooks/config.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/types.ts";

describe("rate limit (GCRA)", () => {
  const t0 = Date.UTC(2026, 0, 1);

  it("lets a minute's worth through as a burst, then refuses with the wait until the next one", () => {
    let tat: number | undefined;
    for (let i = 0; i < 3; i++) {
      const d = decideRate(tat, t0, 3);
      expect(d.allowed).toBe(true);
      tat = d.tatMs;
    }
    const refused = decideRate(tat, t0, 3);
    expect(refused).toMatchObject({ allowed: false, retryAfterS: 20 });
    expect(refused.tatMs).toBe(tat); // a refusal costs nothing
    expect(decideRate(tat, t0 + 19_999, 3).allowed).toBe(false);
    expect(decideRate(tat, t0 + 20_000, 3).allowed).toBe(true);
  });

  it("sustains exactly the configured rate", () => {
    let tat: number | undefined;
    let allowed = 0;
    for (let ms = 0; ms < 10 * 60_000; ms += 100) {
      const d = decideRate(tat, t0 + ms, 60);
      if (d.allowed) {
        allowed++;
        tat = d.tatMs;
      }
    }
    // 60 of burst, then one a second for the remaining ~10 minutes.
    expect(allowed).toBeGreaterThanOrEqual(60 + 599);
    expect(allowed).toBeLessThanOrEqual(60 + 600);
  });

  it("forgets old traffic: a quiet endpoint has its whole burst again", () => {
    const d = decideRate(t0 + 60_000, t0 + 10 * 60_000, 1);
    expect(d).toMatchObject({ allowed: true, tatMs: t0 + 11 * 60_000 });
  });
});

describe("retry backoff", () => {
  const cfg = { backoffBaseMs: 1_000, backoffMaxMs: 60_000 };

  it("doubles per attempt, jittered between half and all of the step, capped", () => {
    expect(retryDelayMs(1, cfg, 0)).toBe(500);
    expect(retryDelayMs(1, cfg, 0.999999)).toBe(1_000);
    expect(retryDelayMs(2, cfg, 1)).toBe(2_000);
    expect(retryDelayMs(4, cfg, 0.5)).toBe(6_000);
    expect(retryDelayMs(30, cfg, 1)).toBe(60_000);
    expect(retryDelayMs(30, cfg, 0)).toBe(30_000);
  });

  it("waits at least what the agent asked for in Retry-After, never past the cap", () => {
    expect(retryDelayMs(1, cfg, 0, 5_000)).toBe(5_000);
    expect(retryDelayMs(1, cfg, 0, 3_600_000)).toBe(60_000);
  });

  it("reads Retry-After as seconds or an HTTP date", () => {
    const now = Date.UTC(2026, 0, 1);
    expect(parseRetryAfterMs("7", now)).toBe(7_000);
    expect(parseRetryAfterMs(new Date(now + 30_000).toUTCString(), now)).toBe(30_000);
    expect(parseRetryAfterMs("soon", now)).toBeUndefined();
    expect(parseRetryAfterMs(null, now)).toBeUndefined();
  });
});

describe("body limit", () => {
  function streamOf(chunks: Uint8Array[], onCancel: () => void): ReadableStream<Uint8Array> {
    let i = 0;
    return new ReadableStream({
      pull(controller) {
        const c = chunks[i++];
        if (c) controller.enqueue(c);
        else controller.close();
      },
      cancel: onCancel,
    });
  }

  it("refuses a declared Content-Length over the limit without reading a byte", async () => {
    const body = new ReadableStream({ start: (c) => c.enqueue(new Uint8Array(11)) });
    const req = new Request("http://x/", { method: "POST", body, headers: { "content-length": "11" }, duplex: "half" } as RequestInit);
    const err = await readBodyLimited(req, 10).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).status).toBe(413);
    expect(req.bodyUsed).toBe(false);
  });

  it("counts streamed bytes when the length is not declared, and stops reading once over", async () => {
    let cancelled = false;
    const chunk = new Uint8Array(4);
    const req = new Request("http://x/", {
      method: "POST",
      body: streamOf([chunk, chunk, chunk, chunk, chunk], () => void (cancelled = true)),
      duplex: "half",
    } as RequestInit);
    const err = await readBodyLimited(req, 10).catch((e: unknown) => e);
    expect((err as AppError).code).toBe("payload_too_large");
    expect(cancelled).toBe(true);
  });

  it("returns the exact bytes at the limit and an empty body as zero bytes", async () => {
    const bytes = new Uint8Array([0, 1, 2, 255, 254, 10, 13, 0, 7, 9]);
    const req = new Request("http://x/", { method: "POST", body: streamOf([bytes.slice(0, 3), bytes.slice(3)], () => {}), duplex: "half" } as RequestInit);
    expect(await readBodyLimited(req, 10)).toEqual(bytes);
    expect((await readBodyLimited(new Request("http://x/", { method: "POST" }), 10)).byteLength).toBe(0);
  });
});

describe("headers", () => {
  const incoming = new Headers([
    ["Content-Type", "application/json"],
    ["Authorization", "Bearer secret"],
    ["Cookie", "a=b"],
    ["Host", "gw.example"],
    ["Content-Length", "12"],
    ["Webhook-Id", "msg_1"],
    ["Webhook-Timestamp", "1"],
    ["Webhook-Signature", "v1,x"],
    ["X-GitHub-Event", "push"],
    ["X-Hub-Signature-256", "sha256=00"],
    ["X-Custom", "kept"],
  ]);

  it("stores everything but connection headers and credentials", () => {
    const stored = headersToStore(incoming);
    const names = stored.map(([n]) => n);
    expect(names).toEqual(expect.arrayContaining(["content-type", "webhook-id", "x-github-event", "x-custom"]));
    for (const dropped of ["authorization", "cookie", "host", "content-length"]) expect(names).not.toContain(dropped);
  });

  it("forwards the signature headers and sender metadata, plus our delivery id and attempt", () => {
    const out = forwardRequestHeaders(headersToStore(incoming), "dlv_abc", 3);
    expect(out.get("webhook-signature")).toBe("v1,x");
    expect(out.get("x-hub-signature-256")).toBe("sha256=00");
    expect(out.get("x-github-event")).toBe("push");
    expect(out.get("content-type")).toBe("application/json");
    expect(out.get("x-webhook-delivery-id")).toBe("dlv_abc");
    expect(out.get("x-webhook-attempt")).toBe("3");
    expect(out.has("x-custom")).toBe(false);
    // A sender cannot choose the delivery id the agent sees.
    expect(forwardRequestHeaders([["x-webhook-delivery-id", "forged"]], "dlv_real", 1).get("x-webhook-delivery-id")).toBe("dlv_real");
  });
});

describe("config", () => {
  it("reads the environment with defaults and refuses a lease shorter than an attempt", () => {
    expect(webhookConfigFromEnv({})).toEqual(defaultWebhookConfig);
    expect(webhookConfigFromEnv({ WEBHOOK_TOLERANCE_S: "60" }).toleranceS).toBe(60);
    expect(() => webhookConfigFromEnv({ WEBHOOK_LEASE_MS: "1000", WEBHOOK_ATTEMPT_TIMEOUT_MS: "5000" })).toThrow(/WEBHOOK_LEASE_MS/);
    expect(() => webhookConfigFromEnv({ WEBHOOK_MAX_BODY_BYTES: "lots" })).toThrow(/integer/);
  });
});
