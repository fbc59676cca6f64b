// Header rules of a proxy (RFC 9110 §7.6.1): hop-by-hop headers stop here; forwarded headers say where a call came from.

const hopByHop = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/** Copies `headers` without hop-by-hop headers, including those the Connection header names. */
export function withoutHopByHop(headers: Headers): Headers {
  const out = new Headers();
  const named = new Set(
    (headers.get("connection") ?? "")
      .split(",")
      .map((s) => s.trim().toLowerCase())
      .filter(Boolean),
  );
  headers.forEach((value, key) => {
    if (!hopByHop.has(key) && !named.has(key)) out.append(key, value);
  });
  // Headers#forEach joins repeated set-cookie values; keep them apart.
  const cookies = headers.getSetCookie?.() ?? [];
  if (cookies.length > 1) {
    out.delete("set-cookie");
    for (const c of cookies) out.append("set-cookie", c);
  }
  return out;
}

export interface ForwardedFrom {
  clientIp: string | undefined;
  proto: string;
  host: string;
  requestId: string;
}

/** The headers an agent receives: the client's, minus hop-by-hop and the gateway's own credential, plus X-Forwarded-*. */
export function upstreamRequestHeaders(incoming: Headers, from: ForwardedFrom, opts: { stripAuthorization: boolean }): Headers {
  const h = withoutHopByHop(incoming);
  if (opts.stripAuthorization) h.delete("authorization");
  const prior = incoming.get("x-forwarded-for");
  if (from.clientIp) h.set("x-forwarded-for", prior ? `${prior}, ${from.clientIp}` : from.clientIp);
  h.set("x-forwarded-proto", from.proto);
  h.set("x-forwarded-host", from.host);
  h.set("x-request-id", from.requestId);
  return h;
}

/** Tokens the Connection header names (lowercase): hop-by-hop for this one message. */
function connectionNamed(value: string | undefined): Set<string> | undefined {
  if (!value) return undefined;
  const named = new Set<string>();
  for (const s of value.split(",")) {
    const t = s.trim().toLowerCase();
    if (t) named.add(t);
  }
  return named;
}

/** Headers the gateway sets itself on the way in; a client's copy of them is replaced (X-Forwarded-For is extended). */
const replacedOnTheWayIn = new Set(["host", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-for", "x-request-id", "expect", "content-length"]);

/**
 * The same rules as `upstreamRequestHeaders`, on Node's flat `rawHeaders` list, rendered as HTTP/1.1 header lines
 * (`name: value\r\n`…) for the Node fast path. Names keep the client's case. Content-Length is left to the caller
 * (it frames the body it sends); Host names the agent's endpoint; Expect is answered by the gateway.
 */
export function upstreamRequestHeadLines(rawHeaders: readonly string[], from: ForwardedFrom, opts: { stripAuthorization: boolean; host: string }): string {
  let connection: string | undefined;
  let priorFor: string | undefined;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const k = rawHeaders[i]!.toLowerCase();
    if (k === "connection") connection = connection ? `${connection}, ${rawHeaders[i + 1]}` : rawHeaders[i + 1];
    else if (k === "x-forwarded-for") priorFor = priorFor ? `${priorFor}, ${rawHeaders[i + 1]}` : rawHeaders[i + 1];
  }
  const named = connectionNamed(connection);
  let out = `host: ${opts.host}\r\n`;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!;
    const k = name.toLowerCase();
    if (hopByHop.has(k) || replacedOnTheWayIn.has(k) || named?.has(k)) continue;
    if (opts.stripAuthorization && k === "authorization") continue;
    out += `${name}: ${rawHeaders[i + 1]}\r\n`;
  }
  if (from.clientIp) out += `x-forwarded-for: ${priorFor ? `${priorFor}, ${from.clientIp}` : from.clientIp}\r\n`;
  else if (priorFor) out += `x-forwarded-for: ${priorFor}\r\n`;
  out += `x-forwarded-proto: ${from.proto}\r\nx-forwarded-host: ${from.host}\r\nx-request-id: ${from.requestId}\r\n`;
  return out;
}

/**
 * A response's flat header list ([name, value, …]) without hop-by-hop headers (and those its Connection header
 * names): what the client receives from the agent. Content-Length stays: the gateway passes the body through as is.
 */
export function downstreamHeaderList(raw: readonly string[]): string[] {
  let connection: string | undefined;
  for (let i = 0; i < raw.length; i += 2) if (raw[i]!.toLowerCase() === "connection") connection = connection ? `${connection}, ${raw[i + 1]}` : raw[i + 1];
  const named = connectionNamed(connection);
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const k = raw[i]!.toLowerCase();
    if (hopByHop.has(k) || named?.has(k)) continue;
    out.push(raw[i]!, raw[i + 1]!);
  }
  return out;
}

const hopByHopForUpgrade = new Set([
  "connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "proxy-connection",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "host",
  "x-forwarded-proto",
  "x-forwarded-host",
  "x-forwarded-for",
  "x-request-id",
  "content-length",
]);

/** The upgrade request's headers for the agent (flat list): the header rules of proxy-headers.ts, plus Connection/Upgrade. */
export function upgradeRequestHeaders(rawHeaders: readonly string[], from: ForwardedFrom, opts: { stripAuthorization: boolean; host: string }): string[] {
  let upgrade = "websocket";
  let priorFor: string | undefined;
  const named = new Set<string>();
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const k = rawHeaders[i]!.toLowerCase();
    if (k === "upgrade") upgrade = rawHeaders[i + 1]!;
    else if (k === "x-forwarded-for") priorFor = priorFor ? `${priorFor}, ${rawHeaders[i + 1]}` : rawHeaders[i + 1];
    else if (k === "connection") for (const t of rawHeaders[i + 1]!.split(",")) named.add(t.trim().toLowerCase());
  }
  const out: string[] = ["host", opts.host];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const k = rawHeaders[i]!.toLowerCase();
    if (hopByHopForUpgrade.has(k) || (named.has(k) && !k.startsWith("sec-websocket"))) continue;
    if (opts.stripAuthorization && k === "authorization") continue;
    out.push(rawHeaders[i]!, rawHeaders[i + 1]!);
  }
  const xff = from.clientIp ? (priorFor ? `${priorFor}, ${from.clientIp}` : from.clientIp) : priorFor;
  if (xff) out.push("x-forwarded-for", xff);
  out.push("x-forwarded-proto", from.proto, "x-forwarded-host", from.host, "x-request-id", from.requestId, "connection", "Upgrade", "upgrade", upgrade);
  return out;
}
