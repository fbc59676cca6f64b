// The rules of upstreams that the gateway (which stores them) and the host's egress proxy (which calls them) share: names, which headers a secret set may hold, the guest-side variable names.

/** An upstream's name: the URL segment (`/u/<name>/…`) and part of `AGENTVM_UPSTREAM_<NAME>_URL`. */
export const upstreamNamePattern = /^[a-z][a-z0-9-]{0,62}$/;

/** Headers a tenant's secret set holds at most, and the longest value, bytes (UTF-8). */
export const maxUpstreamHeaders = 32;
export const maxUpstreamHeaderValueBytes = 8 * 1024;

/** An HTTP field name (RFC 9110 §5.1: a token). */
export const headerNamePattern = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** Headers that belong to one hop (RFC 9110 §7.6.1) or to a proxy: never forwarded by the egress proxy. */
export const hopByHopHeaders: ReadonlySet<string> = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authorization",
  "proxy-authenticate",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/** The hop's headers and `Host`: never a secret header, never forwarded from the agent to an upstream. */
export const upstreamHopHeaders: ReadonlySet<string> = new Set([...hopByHopHeaders, "host"]);

/** Why `name` cannot be a secret header, or undefined when it can. */
export function secretHeaderRefusal(name: string): string | undefined {
  if (!headerNamePattern.test(name)) return `header name "${name.slice(0, 64)}" is not an HTTP token`;
  const lower = name.toLowerCase();
  if (upstreamHopHeaders.has(lower) || lower === "content-length")
    return `header "${name}" belongs to the connection (hop-by-hop, Host or Content-Length): it cannot be a secret header`;
  return undefined;
}

/** `AGENTVM_UPSTREAM_<NAME>_URL`: the name upper-cased, `-` as `_`. */
export function upstreamEnvName(name: string): string {
  return `AGENTVM_UPSTREAM_${name.toUpperCase().replace(/-/g, "_")}_URL`;
}

/** The header an agent names a call's idempotency key with, and what a key may be: 1–255 printable ASCII characters. */
export const idempotencyKeyHeader = "idempotency-key";
export const idempotencyKeyPattern = /^[\x20-\x7e]{1,255}$/;
/** The header a replayed answer carries: the operation whose recorded outcome it is. */
export const replayedHeader = "x-agentvm-replayed";
/** The header every answer through an upstream carries: its operation id. */
export const operationHeader = "x-agentvm-operation";

/**
 * Where a VM's guest finds the host's egress proxy (QEMU's user network forwards it: fleet-agent/egress/guest-address.ts)
 * and, below it, its tenant's upstreams: `http://10.0.2.100:3128/u/<name>/…`. Here because the API shows it too.
 */
export const EGRESS_PROXY_GUEST_IP = "10.0.2.100";
export const EGRESS_PROXY_GUEST_PORT = 3128;
export const upstreamsGuestUrl = `http://${EGRESS_PROXY_GUEST_IP}:${EGRESS_PROXY_GUEST_PORT}/u`;
/** The variable every VM's workload finds `upstreamsGuestUrl` in. */
export const upstreamsUrlEnv = "AGENTVM_UPSTREAMS_URL";
