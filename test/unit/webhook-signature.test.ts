// Webhook signatures: the published Standard Webhooks and GitHub vectors, and every way a request must be refused.
import { describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import { activeSecrets, generateSecret, signGithub, signStandard, verifyWebhook, type VerifyInput } from "../../gateway/webhooks/signature.ts";
import { base64Decode, constantTimeEqual, hexDecode } from "../../gateway/webhooks/bytes.ts";

const enc = (s: string) => new TextEncoder().encode(s);

// The Standard Webhooks reference libraries' "sign function works" vector (libraries/javascript/src/webhook.test.ts).
const spec = {
  secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
  id: "msg_p5jXN8AQM9LWM0D4loKWxJek",
  timestamp: 1614265330,
  payload: '{"test": 2432232314}',
  expected: "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
};
// GitHub's documented example ("Validating webhook deliveries": testing the webhook payload validation).
const gh = {
  secret: "It's a Secret to Everybody",
  payload: "Hello, World!",
  expected: "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
};

type InputOverrides = Partial<Omit<VerifyInput, "headers">> & { headers?: Record<string, string> };

function standardInput(overrides: InputOverrides = {}): VerifyInput {
  return {
    scheme: "standard",
    body: enc(spec.payload),
    secrets: [spec.secret],
    nowMs: spec.timestamp * 1000,
    toleranceS: 300,
    ...overrides,
    headers: new Headers(overrides.headers ?? { "webhook-id": spec.id, "webhook-timestamp": String(spec.timestamp), "webhook-signature": spec.expected }),
  };
}

async function refusal(p: Promise<unknown>): Promise<AppError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  return err as AppError;
}

describe("Standard Webhooks", () => {
  it("signs the specification's test vector exactly", async () => {
    expect(await signStandard(spec.secret, spec.id, spec.timestamp, enc(spec.payload))).toBe(spec.expected);
    // The whsec_ prefix is optional, as in the reference libraries.
    expect(await signStandard(spec.secret.slice(6), spec.id, spec.timestamp, enc(spec.payload))).toBe(spec.expected);
  });

  it("verifies the test vector at its own time and answers the sender's delivery id", async () => {
    expect(await verifyWebhook(standardInput())).toEqual({ externalId: spec.id, secretIndex: 0 });
  });

  it("refuses a tampered body, a wrong secret, a changed id or timestamp", async () => {
    expect((await refusal(verifyWebhook(standardInput({ body: enc('{"test": 2432232315}') })))).code).toBe("invalid_signature");
    expect((await refusal(verifyWebhook(standardInput({ secrets: [generateSecret("standard")] })))).status).toBe(401);
    const headers = { "webhook-id": "msg_other", "webhook-timestamp": String(spec.timestamp), "webhook-signature": spec.expected };
    expect((await refusal(verifyWebhook(standardInput({ headers })))).code).toBe("invalid_signature");
    const shifted = { "webhook-id": spec.id, "webhook-timestamp": String(spec.timestamp + 1), "webhook-signature": spec.expected };
    expect((await refusal(verifyWebhook(standardInput({ headers: shifted, nowMs: (spec.timestamp + 1) * 1000 })))).message).toMatch(
      /no webhook-signature entry matches/,
    );
  });

  it("refuses stale and future timestamps outside the tolerance, and accepts them at its edge", async () => {
    const at = (offsetS: number) => standardInput({ nowMs: (spec.timestamp + offsetS) * 1000 });
    await expect(verifyWebhook(at(300))).resolves.toMatchObject({ externalId: spec.id });
    await expect(verifyWebhook(at(-300))).resolves.toMatchObject({ externalId: spec.id });
    expect((await refusal(verifyWebhook(at(301)))).message).toMatch(/301 s old/);
    expect((await refusal(verifyWebhook(at(-301)))).message).toMatch(/301 s in the future/);
    expect((await refusal(verifyWebhook(at(-301)))).status).toBe(401);
  });

  it("refuses missing headers, naming them, and a timestamp that is not whole seconds", async () => {
    const all = { "webhook-id": spec.id, "webhook-timestamp": String(spec.timestamp), "webhook-signature": spec.expected };
    for (const name of Object.keys(all) as (keyof typeof all)[]) {
      const headers: Record<string, string> = { ...all };
      delete headers[name];
      const err = await refusal(verifyWebhook(standardInput({ headers })));
      expect(err.code).toBe("invalid_signature");
      expect(err.message).toContain(name);
    }
    const err = await refusal(verifyWebhook(standardInput({ headers: { ...all, "webhook-timestamp": "1614265330.5" } })));
    expect(err.message).toMatch(/whole seconds/);
  });

  it("accepts several signatures where one matches, skipping other versions and garbage", async () => {
    const signature = ["v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=", "v2,whatever", "v1,not*base64", spec.expected, "v1,"].join(" ");
    const headers = { "webhook-id": spec.id, "webhook-timestamp": String(spec.timestamp), "webhook-signature": signature };
    await expect(verifyWebhook(standardInput({ headers }))).resolves.toMatchObject({ externalId: spec.id });
    const noneMatch = { ...headers, "webhook-signature": "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,x" };
    expect((await refusal(verifyWebhook(standardInput({ headers: noneMatch })))).code).toBe("invalid_signature");
    // A matching MAC under another version label does not count.
    const wrongVersion = { ...headers, "webhook-signature": spec.expected.replace("v1,", "v2,") };
    expect((await refusal(verifyWebhook(standardInput({ headers: wrongVersion })))).code).toBe("invalid_signature");
  });

  it("signs the body's raw bytes, not a re-encoding of them", async () => {
    const body = new Uint8Array([0xff, 0xfe, 0x00, 0x80]); // not UTF-8
    const secret = generateSecret("standard");
    const signature = await signStandard(secret, "msg_1", spec.timestamp, body);
    const headers = { "webhook-id": "msg_1", "webhook-timestamp": String(spec.timestamp), "webhook-signature": signature };
    await expect(verifyWebhook(standardInput({ headers, body, secrets: [secret] }))).resolves.toMatchObject({ externalId: "msg_1" });
    const lossy = enc(new TextDecoder().decode(body));
    expect((await refusal(verifyWebhook(standardInput({ headers, body: lossy, secrets: [secret] })))).code).toBe("invalid_signature");
  });
});

describe("GitHub", () => {
  const input = (over: InputOverrides = {}): VerifyInput => ({
    scheme: "github",
    body: enc(gh.payload),
    secrets: [gh.secret],
    nowMs: Date.UTC(2030, 0, 1), // GitHub sends no timestamp: any time verifies
    toleranceS: 300,
    ...over,
    headers: new Headers(over.headers ?? { "x-hub-signature-256": gh.expected, "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958" }),
  });

  it("signs GitHub's documented example exactly", async () => {
    expect(await signGithub(gh.secret, enc(gh.payload))).toBe(gh.expected);
  });

  it("verifies it and uses X-GitHub-Delivery as the delivery id; upper-case hex also verifies", async () => {
    await expect(verifyWebhook(input())).resolves.toEqual({ externalId: "72d3162e-cc78-11e3-81ab-4c9367dc0958", secretIndex: 0 });
    const upper = { "x-hub-signature-256": `sha256=${gh.expected.slice(7).toUpperCase()}`, "x-github-delivery": "d1" };
    await expect(verifyWebhook(input({ headers: upper }))).resolves.toMatchObject({ externalId: "d1" });
  });

  it("refuses a tampered body, a wrong secret, a malformed or missing signature", async () => {
    expect((await refusal(verifyWebhook(input({ body: enc("Hello, World?") })))).code).toBe("invalid_signature");
    expect((await refusal(verifyWebhook(input({ secrets: ["It's a Secret to Everybody!"] })))).code).toBe("invalid_signature");
    const sha1Only = { "x-hub-signature": "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59", "x-github-delivery": "d1" };
    expect((await refusal(verifyWebhook(input({ headers: sha1Only })))).message).toMatch(/missing X-Hub-Signature-256/);
    const truncated = { "x-hub-signature-256": gh.expected.slice(0, -2), "x-github-delivery": "d1" };
    expect((await refusal(verifyWebhook(input({ headers: truncated })))).code).toBe("invalid_signature");
    const noPrefix = { "x-hub-signature-256": gh.expected.slice(7), "x-github-delivery": "d1" };
    expect((await refusal(verifyWebhook(input({ headers: noPrefix })))).code).toBe("invalid_signature");
  });

  it("checks the signature before asking for the delivery id", async () => {
    const unsignedNoId = { "x-hub-signature-256": "sha256=00" };
    expect((await refusal(verifyWebhook(input({ headers: unsignedNoId })))).status).toBe(401);
    const signedNoId = { "x-hub-signature-256": gh.expected };
    expect((await refusal(verifyWebhook(input({ headers: signedNoId })))).code).toBe("bad_request");
  });
});

describe("rotation", () => {
  const t0 = Date.UTC(2026, 0, 1);
  const rotated = { secret: "whsec_new", previousSecret: spec.secret, previousSecretExpiresAt: new Date(t0 + 60_000) };

  it("the previous secret verifies during the overlap and not after it", async () => {
    const during = activeSecrets(rotated, t0 + 59_999);
    expect(during).toEqual(["whsec_new", spec.secret]);
    await expect(verifyWebhook(standardInput({ secrets: during }))).resolves.toMatchObject({ secretIndex: 1 });

    const after = activeSecrets(rotated, t0 + 60_000);
    expect(after).toEqual(["whsec_new"]);
    expect((await refusal(verifyWebhook(standardInput({ secrets: after })))).code).toBe("invalid_signature");
  });

  it("the new secret verifies at once, during the overlap too", async () => {
    const fresh = generateSecret("standard");
    const secrets = activeSecrets({ secret: fresh, previousSecret: spec.secret, previousSecretExpiresAt: new Date(t0 + 60_000) }, t0);
    const signature = await signStandard(fresh, spec.id, spec.timestamp, enc(spec.payload));
    const headers = { "webhook-id": spec.id, "webhook-timestamp": String(spec.timestamp), "webhook-signature": signature };
    await expect(verifyWebhook(standardInput({ headers, secrets }))).resolves.toMatchObject({ secretIndex: 0 });
  });

  it("without a rotation only the current secret verifies", () => {
    expect(activeSecrets({ secret: "a", previousSecret: null, previousSecretExpiresAt: null }, t0)).toEqual(["a"]);
  });
});

describe("secrets and comparisons", () => {
  it("generates whsec_ base64 secrets of 24 random bytes and 64-hex-digit GitHub secrets, never the same twice", () => {
    const s = generateSecret("standard");
    expect(s).toMatch(/^whsec_[A-Za-z0-9+/]{32}$/);
    expect(base64Decode(s.slice(6))?.byteLength).toBe(24);
    expect(generateSecret("standard")).not.toBe(s);
    const g = generateSecret("github");
    expect(g).toMatch(/^[0-9a-f]{64}$/);
    expect(hexDecode(g)?.byteLength).toBe(32);
  });

  it("constantTimeEqual compares whole arrays, lengths first", () => {
    expect(constantTimeEqual(new Uint8Array([1, 2, 3]), new Uint8Array([1, 2, 3]))).toBe(true);
    expect(constantTimeEqual(new Uint8Array([1, 2, 3]), new Uint8Array([1, 2, 4]))).toBe(false);
    expect(constantTimeEqual(new Uint8Array([0, 2, 3]), new Uint8Array([1, 2, 3]))).toBe(false);
    expect(constantTimeEqual(new Uint8Array([1, 2]), new Uint8Array([1, 2, 3]))).toBe(false);
    expect(constantTimeEqual(new Uint8Array(0), new Uint8Array(0))).toBe(true);
  });
});
