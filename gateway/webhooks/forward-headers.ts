// Which request headers a delivery keeps at intake, and which of them travel on to the agent.

/** Connection-level headers (meaningless once stored) and credentials (never kept at rest). */
const notStored = new Set([
  "connection",
  "keep-alive",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "proxy-connection",
  "content-length",
  "host",
  "authorization",
  "proxy-authorization",
  "cookie",
]);

/** The headers of an intake request as stored: lower-case names in arrival order. */
export function headersToStore(headers: Headers): [string, string][] {
  const out: [string, string][] = [];
  headers.forEach((value, name) => {
    if (!notStored.has(name)) out.push([name, value]);
  });
  return out;
}

/** Headers an agent needs to verify and interpret a webhook itself: content type, signatures, sender metadata. */
function forwarded(name: string): boolean {
  return (
    name === "content-type" ||
    name === "content-encoding" ||
    name === "user-agent" ||
    name.startsWith("webhook-") ||
    name.startsWith("x-github-") ||
    name.startsWith("x-agentvm-operation-") ||
    name.startsWith("x-hub-signature")
  );
}

/** The headers of the request forwarded to the agent: the original signature headers plus our delivery id and attempt. */
export function forwardRequestHeaders(stored: readonly [string, string][], deliveryId: string, attempt: number, requestId?: string): Headers {
  const headers = new Headers();
  for (const [name, value] of stored) if (forwarded(name)) headers.append(name, value);
  headers.set("x-webhook-delivery-id", deliveryId);
  headers.set("x-webhook-attempt", String(attempt));
  if (requestId) headers.set("x-request-id", requestId);
  return headers;
}
