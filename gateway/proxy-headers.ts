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
  const named = new Set((headers.get("connection") ?? "").split(",").map((s) => s.trim().toLowerCase()).filter(Boolean));
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
