// The doze tests' and bench's slow model (scripts/bench/slow-model.ts) over real sockets: the wait before its first
// byte, an OpenAI-style SSE stream with a final usage chunk, per-path plans, what it records (timings, FNV-1a of what
// it sent, a client that left early), and its HTTPS listener with the certificate it made.
import { request as httpsRequest } from "node:https";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fnv1a, fnvHex, SlowModel } from "../../scripts/bench/slow-model.ts";

let model: SlowModel;

beforeAll(async () => {
  model = await SlowModel.start({ firstByteMs: 150, tokens: 3, gapMs: 20, tls: true });
});

afterAll(async () => {
  await model?.close();
});

/** The data lines of an SSE body. */
const events = (body: string) =>
  body
    .split("\n\n")
    .filter(Boolean)
    .map((e) => e.replace(/^data: /, ""));

describe("the slow model", () => {
  it("answers after firstByteMs with tokens gapMs apart, a usage chunk and [DONE]; records the call", async () => {
    const t0 = performance.now();
    const res = await fetch(model.url());
    const headersAt = performance.now() - t0;
    const body = await res.text();
    const total = performance.now() - t0;
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    expect(headersAt).toBeGreaterThanOrEqual(140);
    expect(total).toBeGreaterThanOrEqual(150 + 3 * 20 - 10);
    const data = events(body);
    expect(data.at(-1)).toBe("[DONE]");
    const chunks = data
      .slice(0, -1)
      .map((d) => JSON.parse(d) as { id: string; choices: { delta: { content?: string }; finish_reason: string | null }[]; usage?: Record<string, number> });
    expect(chunks.map((c) => c.choices[0]!.delta.content ?? "").join("")).toBe("tok0 tok1 tok2 ");
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("stop");
    expect(chunks.at(-1)!.usage).toEqual({ prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 });
    const call = model.calls.at(-1)!;
    expect(call).toMatchObject({ method: "GET", path: "/v1/chat/completions", plan: { firstByteMs: 150, tokens: 3, gapMs: 20 }, closedEarly: false });
    expect(call.bytes).toBe(Buffer.byteLength(body));
    expect(call.fnv).toBe(fnvHex(fnv1a(Buffer.from(body))));
    expect(call.firstByteAt! - call.requestEndedAt!).toBeGreaterThanOrEqual(145);
    expect(call.endedAt! - call.firstByteAt!).toBeGreaterThanOrEqual(3 * 20 - 5);
    expect(Math.abs(call.firstByteWallMs! - (performance.timeOrigin + call.firstByteAt!))).toBeLessThan(1);
  });

  it("takes its plan from /slow/<firstByteMs>/<tokens>/<gapMs>, and tells a client that left early", async () => {
    const fast = await fetch(model.url(SlowModel.path({ firstByteMs: 0, tokens: 5, gapMs: 1 })));
    expect(events(await fast.text())).toHaveLength(6 + 1);
    expect(model.calls.at(-1)!.plan).toEqual({ firstByteMs: 0, tokens: 5, gapMs: 1 });

    const open = model.open();
    const gone = new AbortController();
    const res = await fetch(model.url(SlowModel.path({ firstByteMs: 0, tokens: 50, gapMs: 50 })), { signal: gone.signal });
    expect(res.status).toBe(200);
    expect(model.open()).toBe(open + 1);
    gone.abort();
    const left = model.calls.at(-1)!;
    for (let i = 0; i < 100 && !left.closedEarly; i++) await new Promise((r) => setTimeout(r, 10));
    expect(left.closedEarly).toBe(true);
    expect(left.endedAt).toBeUndefined();
    expect(model.open()).toBe(open);
  });

  it("serves the same over HTTPS with the certificate it made for 127.0.0.1", async () => {
    expect(model.certPem).toMatch(/^-----BEGIN CERTIFICATE-----/);
    const body = await new Promise<string>((resolve, reject) => {
      const req = httpsRequest(
        { host: "127.0.0.1", port: model.tlsPort, path: SlowModel.path({ firstByteMs: 0, tokens: 1, gapMs: 1 }), ca: model.certPem },
        (res) => {
          let text = "";
          res.setEncoding("utf8");
          res.on("data", (d: string) => (text += d));
          res.on("end", () => resolve(text));
        },
      );
      req.on("error", reject);
      req.end();
    });
    expect(events(body).at(-1)).toBe("[DONE]");
  });
});
