// Upstreams' pure parts: sealing secret headers (round trip; tampering, another key or another row refused), the
// request hash (what changes it and what does not), the upstream path's parsing, the outgoing headers (the secret
// wins, hop-by-hop dropped), and the usage readers for OpenAI- and Anthropic-style JSON bodies and SSE streams.
import { describe, expect, it } from "vitest";
import { base64url, importSealKey, parseSealKey, seal, unseal } from "../../lib/seal.ts";
import { outgoingHeaders, requestHasher, upstreamTarget } from "../../fleet-agent/egress/upstreams.ts";
import { usageReader } from "../../fleet-agent/egress/usage.ts";
import { baseUrlRefusal } from "../../gateway/upstreams/api-schemas.ts";

const rawKey = () => crypto.getRandomValues(new Uint8Array(32));

describe("sealing", () => {
  it("round trips, in the v1.<iv>.<tag>.<ciphertext> form, a fresh IV each time", async () => {
    const key = await importSealKey(rawKey());
    const text = JSON.stringify({ Authorization: "Bearer sk-secret" });
    const a = await seal(key, text, "ups_1");
    const b = await seal(key, text, "ups_1");
    expect(a).toMatch(/^v1\.[A-Za-z0-9_-]{16}\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]+$/);
    expect(a).not.toBe(b);
    expect(a).not.toContain("sk-secret");
    expect(await unseal(key, a, "ups_1")).toBe(text);
  });

  it("refuses a tampered value, another key, another row's context, and what is no sealed value", async () => {
    const key = await importSealKey(rawKey());
    const sealed = await seal(key, "secret", "ups_1");
    const [v, iv, tag, ct] = sealed.split(".");
    const flipped = `${v}.${iv}.${tag}.${ct!.slice(0, -2)}${ct!.slice(-2) === "AA" ? "AB" : "AA"}`;
    await expect(unseal(key, flipped, "ups_1")).rejects.toThrow(/does not open/);
    await expect(unseal(await importSealKey(rawKey()), sealed, "ups_1")).rejects.toThrow(/does not open/);
    await expect(unseal(key, sealed, "ups_2")).rejects.toThrow(/does not open/);
    await expect(unseal(key, "v2.a.b.c", "ups_1")).rejects.toThrow(/v1 form/);
    await expect(unseal(key, `v1.${iv}.short.${ct}`, "ups_1")).rejects.toThrow(/malformed/);
  });

  it("keys are 32 bytes, read from base64url or base64 text", async () => {
    const raw = rawKey();
    expect(parseSealKey(`${base64url(raw)}\n`)).toEqual(raw);
    expect(parseSealKey(Buffer.from(raw).toString("base64"))).toEqual(raw);
    expect(parseSealKey(base64url(raw.subarray(0, 16)))).toBeUndefined();
    expect(parseSealKey("not a key!")).toBeUndefined();
    await expect(importSealKey(raw.subarray(0, 31))).rejects.toThrow(/32 bytes/);
  });
});

describe("the request hash", () => {
  const hash = (method: string, path: string, body: string, ct?: string, accept?: string) => requestHasher(method, path, ct, accept).update(body).digest("hex");
  it("is the same for the same request and changes with the method, path, query, body, content-type or accept", () => {
    const base = hash("POST", "/v1/chat/completions", '{"a":1}', "application/json", "*/*");
    expect(hash("post", "/v1/chat/completions", '{"a":1}', "application/json", "*/*")).toBe(base);
    expect(base).toMatch(/^[0-9a-f]{64}$/);
    for (const other of [
      hash("PUT", "/v1/chat/completions", '{"a":1}', "application/json", "*/*"),
      hash("POST", "/v1/completions", '{"a":1}', "application/json", "*/*"),
      hash("POST", "/v1/chat/completions?x=1", '{"a":1}', "application/json", "*/*"),
      hash("POST", "/v1/chat/completions", '{"a":2}', "application/json", "*/*"),
      hash("POST", "/v1/chat/completions", '{"a":1}', "text/plain", "*/*"),
      hash("POST", "/v1/chat/completions", '{"a":1}', "application/json", "text/event-stream"),
    ])
      expect(other).not.toBe(base);
  });
});

describe("the upstream path", () => {
  it("splits /u/<name>/<rest> (the query stays with the rest)", () => {
    expect(upstreamTarget("/u/openai/v1/chat/completions?x=1")).toEqual({ name: "openai", rest: "/v1/chat/completions?x=1" });
    expect(upstreamTarget("/u/openai")).toEqual({ name: "openai", rest: "/" });
    expect(upstreamTarget("/u/openai?x=1")).toEqual({ name: "openai", rest: "/?x=1" });
    expect(upstreamTarget("/x/openai/v1")).toBeUndefined();
    expect(upstreamTarget("http://example.com/u/a")).toBeUndefined();
  });

  it("sends the agent's headers without hop-by-hop ones, Host, Content-Length or one named like a secret (the secret wins)", () => {
    const out = outgoingHeaders(
      [
        "Host",
        "10.0.2.100:3128",
        "Connection",
        "keep-alive",
        "Authorization",
        "Bearer agent",
        "Content-Type",
        "application/json",
        "Content-Length",
        "9",
        "Accept-Encoding",
        "gzip",
        "X-Trace",
        "1",
      ],
      { Authorization: "Bearer sk-secret", "X-Org": "org" },
    );
    expect(out).toEqual({
      "content-type": "application/json",
      "x-trace": "1",
      authorization: "Bearer sk-secret",
      "x-org": "org",
      "accept-encoding": "identity",
    });
  });

  it("base URLs: https, or http only to a loopback or private address literal; no credentials, query or fragment", () => {
    expect(baseUrlRefusal("https://api.openai.com/v1")).toBeUndefined();
    expect(baseUrlRefusal("http://127.0.0.1:8000/v1")).toBeUndefined();
    expect(baseUrlRefusal("http://10.1.2.3")).toBeUndefined();
    expect(baseUrlRefusal("http://api.openai.com/v1")).toMatch(/https/);
    expect(baseUrlRefusal("ftp://x")).toMatch(/https/);
    expect(baseUrlRefusal("https://user:pw@x.com")).toMatch(/user name/);
    expect(baseUrlRefusal("https://x.com/?a=1")).toMatch(/query/);
    expect(baseUrlRefusal("https://x.com/#a")).toMatch(/fragment/);
    expect(baseUrlRefusal("nope")).toMatch(/absolute/);
  });
});

/** Feeds `text` to a reader in chunks of `size` bytes (split anywhere: mid-line, mid-CRLF, mid-UTF-8). */
function read(contentType: string, text: string, size = 7) {
  const r = usageReader(contentType, { maxJsonBytes: 1 << 20, maxEventBytes: 1 << 16 })!;
  const bytes = Buffer.from(text);
  for (let i = 0; i < bytes.length; i += size) r.push(bytes.subarray(i, i + size));
  return r.end();
}

describe("usage", () => {
  it("an OpenAI chat completion (JSON)", () => {
    const body = JSON.stringify({ id: "c", model: "gpt-4o-2024", choices: [], usage: { prompt_tokens: 12, completion_tokens: 34, total_tokens: 46 } });
    expect(read("application/json; charset=utf-8", body)).toEqual({ model: "gpt-4o-2024", inputTokens: 12, outputTokens: 34 });
  });

  it("an Anthropic message (JSON)", () => {
    const body = JSON.stringify({ type: "message", model: "claude-sonnet-4", content: [], usage: { input_tokens: 7, output_tokens: 9 } });
    expect(read("application/json", body, 3)).toEqual({ model: "claude-sonnet-4", inputTokens: 7, outputTokens: 9 });
  });

  it("an OpenAI stream: usage in its final chunk (include_usage), then [DONE]; CRLF line ends", () => {
    const events = [
      { model: "gpt-4o", choices: [{ delta: { content: "Hel" } }], usage: null },
      { model: "gpt-4o", choices: [{ delta: { content: "lo" } }], usage: null },
      { model: "gpt-4o", choices: [], usage: { prompt_tokens: 5, completion_tokens: 2 } },
    ];
    const text = `${events.map((e) => `data: ${JSON.stringify(e)}\r\n\r\n`).join("")}data: [DONE]\r\n\r\n`;
    for (const size of [1, 2, 5, 64, 4096]) expect(read("text/event-stream", text, size)).toEqual({ model: "gpt-4o", inputTokens: 5, outputTokens: 2 });
  });

  it("an Anthropic stream: message_start (model, input tokens), message_delta (output tokens so far), with event: lines", () => {
    const ev = (type: string, data: unknown) => `event: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
    const text =
      ev("message_start", { type: "message_start", message: { model: "claude-opus-4", usage: { input_tokens: 25, output_tokens: 1 } } }) +
      ev("content_block_delta", { type: "content_block_delta", delta: { text: "Hi" } }) +
      ev("message_delta", { type: "message_delta", delta: { stop_reason: "end_turn" }, usage: { output_tokens: 15 } }) +
      ev("message_stop", { type: "message_stop" });
    expect(read("text/event-stream", text, 3)).toEqual({ model: "claude-opus-4", inputTokens: 25, outputTokens: 15 });
  });

  it("bounded: an event or body over its limit is skipped; other types are not read", () => {
    const r = usageReader("text/event-stream", { maxJsonBytes: 100, maxEventBytes: 100 })!;
    r.push(Buffer.from(`data: ${JSON.stringify({ model: "big", pad: "x".repeat(500) })}\n\n`));
    r.push(Buffer.from(`data: ${JSON.stringify({ model: "small", usage: { input_tokens: 1, output_tokens: 2 } })}\n\n`));
    expect(r.end()).toEqual({ model: "small", inputTokens: 1, outputTokens: 2 });
    const j = usageReader("application/json", { maxJsonBytes: 50, maxEventBytes: 50 })!;
    j.push(Buffer.from(JSON.stringify({ model: "m", usage: { prompt_tokens: 1 }, pad: "y".repeat(100) })));
    expect(j.end()).toEqual({});
    expect(usageReader("text/plain")).toBeUndefined();
  });
});
