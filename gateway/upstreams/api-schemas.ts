// The upstreams API's schemas: a tenant's named outbound endpoints (base URL and secret headers) as bodies validate them and answers show them (header names only, never values).
import { NextCursor, PageQuery, z } from "../../lib/api.ts";
import { objectError } from "../proxy/policy.ts";
import { maxUpstreamHeaders, maxUpstreamHeaderValueBytes, secretHeaderRefusal, upstreamNamePattern } from "../../lib/upstreams.ts";

/** Bodies are a URL and ≤ 32 headers of ≤ 8 KiB: 512 KiB holds the largest. */
export const maxUpstreamBodyBytes = 512 * 1024;

const nameHint = "1–63 of a-z, 0-9 and -, starting with a letter";

/**
 * Why `text` cannot be an upstream's base URL, or undefined. `https://` always; `http://` only to a loopback or
 * private address literal (or `localhost`): a service on the operator's own network, which hosts reach only where
 * `EGRESS_ALLOW` names it. Anywhere else the secret headers would cross networks in clear. No user name or password
 * (the secret headers carry credentials), no query, no fragment.
 */
export function baseUrlRefusal(text: string): string | undefined {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return "must be an absolute URL (https://…)";
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return "must be an https:// URL";
  if (url.protocol === "http:" && !privateHost(url.hostname))
    return "must be https:// (plain http:// only to a loopback or private address literal, or localhost: the secret headers would cross networks in clear)";
  if (url.username || url.password) return "must not carry a user name or password (put credentials in the secret headers)";
  if (url.search || text.includes("?")) return "must not have a query";
  if (url.hash || text.includes("#")) return "must not have a fragment";
  return undefined;
}

function privateHost(host: string): boolean {
  if (host === "localhost" || host === "[::1]") return true;
  const v4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(host);
  if (v4) {
    const [a, b] = [Number(v4[1]), Number(v4[2])];
    return a === 127 || a === 10 || (a === 172 && b >= 16 && b <= 31) || (a === 192 && b === 168);
  }
  return /^\[f[cd][0-9a-f]{2}:/i.test(host);
}

const BaseUrl = z
  .string({ error: "must be an https:// URL" })
  .max(2048, { error: "must be at most 2048 characters" })
  .superRefine((v, ctx) => {
    const why = baseUrlRefusal(v);
    if (why) ctx.addIssue({ code: "custom", message: why });
  })
  .openapi({
    description:
      "Where calls go: `baseUrl` + the path below `/u/<name>`. https://; http:// only to a loopback or private address literal or localhost. No credentials, query or fragment",
    example: "https://api.openai.com/v1",
  });

const utf8Bytes = (s: string) => new TextEncoder().encode(s).length;

const SecretHeaders = z
  .record(z.string(), z.string({ error: "must be a string" }))
  .superRefine((headers, ctx) => {
    const names = Object.keys(headers);
    if (names.length > maxUpstreamHeaders) ctx.addIssue({ code: "custom", message: `must hold at most ${maxUpstreamHeaders} headers` });
    const seen = new Set<string>();
    for (const name of names) {
      const why = secretHeaderRefusal(name);
      if (why) ctx.addIssue({ code: "custom", message: why, path: [name] });
      if (seen.has(name.toLowerCase())) ctx.addIssue({ code: "custom", message: `header "${name}" is named twice (names ignore case)`, path: [name] });
      seen.add(name.toLowerCase());
      const value = headers[name]!;
      if (utf8Bytes(value) > maxUpstreamHeaderValueBytes)
        ctx.addIssue({ code: "custom", message: `must be at most ${maxUpstreamHeaderValueBytes} bytes`, path: [name] });
      if (/[\r\n\0]/.test(value)) ctx.addIssue({ code: "custom", message: "must not contain CR, LF or NUL", path: [name] });
    }
  })
  .openapi({
    description:
      "Secret headers `{Name: value}` the host adds to every call (they win over the agent's own of the same name). Stored sealed; never shown again",
    example: { Authorization: "Bearer sk-…" },
  });

export const NewUpstream = z
  .strictObject(
    {
      name: z
        .string({ error: `must be ${nameHint}` })
        .regex(upstreamNamePattern, { error: `must be ${nameHint}` })
        .openapi({ description: "Unique in the tenant: agents call `http://10.0.2.100:3128/u/<name>/…`", example: "openai" }),
      baseUrl: BaseUrl,
      headers: SecretHeaders.default({}),
    },
    { error: objectError("a JSON object {name, baseUrl, headers}") },
  )
  .openapi("NewUpstream");

export const UpstreamPatch = z
  .strictObject({ baseUrl: BaseUrl.optional(), headers: SecretHeaders.optional() }, { error: objectError("a JSON object {baseUrl?, headers?}") })
  .refine((p) => p.baseUrl !== undefined || p.headers !== undefined, { error: "must change baseUrl or headers (headers replace the whole set)" })
  .openapi("UpstreamPatch");

export const UpstreamParams = z.object({
  name: z.string().openapi({ param: { name: "name", in: "path" }, description: "Upstream name", example: "openai" }),
});

export const UpstreamListQuery = z.strictObject({ ...PageQuery.shape });

export const UpstreamSchema = z
  .object({
    id: z.string().openapi({ example: "ups_0123456789abcdef" }),
    name: z.string(),
    baseUrl: z.string(),
    headerNames: z.array(z.string()).openapi({ description: "The secret headers' names; their values are never shown" }),
    url: z.string().openapi({ description: "Where an agent calls it, inside its VM", example: "http://10.0.2.100:3128/u/openai" }),
    env: z.string().openapi({ description: "The variable an agent booted after its creation finds that URL in", example: "AGENTVM_UPSTREAM_OPENAI_URL" }),
    createdAt: z.iso.datetime(),
    updatedAt: z.iso.datetime(),
  })
  .openapi("Upstream");

export const UpstreamListSchema = z.object({ upstreams: z.array(UpstreamSchema), nextCursor: NextCursor }).openapi("UpstreamList");
