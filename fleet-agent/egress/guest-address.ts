// Where a VM's guest finds the host's egress proxy: an address of QEMU's user network (10.0.2.0/24) that no other
// service of it uses, forwarded to the proxy by a guestfwd (drivers/qemu/args.ts). The guest's workload learns it as
// `HTTP_PROXY`/`HTTPS_PROXY` (and lowercase, with `NO_PROXY`), plus `NODE_USE_ENV_PROXY=1` (`egressProxyEnv`); every VM,
// with egress or not, finds its tenant's upstreams below it (`AGENTVM_UPSTREAMS_URL`, `AGENTVM_UPSTREAM_<NAME>_URL`).
import { EGRESS_PROXY_GUEST_IP, EGRESS_PROXY_GUEST_PORT, upstreamEnvName, upstreamsGuestUrl, upstreamsUrlEnv } from "../../lib/upstreams.ts";

export { EGRESS_PROXY_GUEST_IP, EGRESS_PROXY_GUEST_PORT };
export const egressProxyUrl = `http://${EGRESS_PROXY_GUEST_IP}:${EGRESS_PROXY_GUEST_PORT}`;

/** Not through the proxy: the guest itself, and the proxy's own address (an upstream is called there directly, `/u/<name>/…`). */
export const noProxy = `localhost,127.0.0.1,${EGRESS_PROXY_GUEST_IP}`;

/**
 * The environment a workload with egress gets: the proxy under every name HTTP clients look for it, and what makes
 * the common runtimes use it. Checked: Node ≥ 24's built-in `fetch` and `http`/`https` go direct unless
 * `NODE_USE_ENV_PROXY=1` (with it, `fetch` tunnels plain HTTP too with `CONNECT`: tried on Node 24.21); Python's
 * `requests`, `httpx` and `urllib`, Go's `net/http`, Deno and Bun read `HTTP(S)_PROXY`/`NO_PROXY` (either case) as
 * they are; curl reads `https_proxy`/`HTTPS_PROXY` but only the lowercase `http_proxy` (hence both cases). Not
 * reachable by the environment: aiohttp (only with `trust_env=True` in the code), the JVM (system properties; a
 * `JAVA_TOOL_OPTIONS` here would replace the image's own and print a line on every start).
 */
export function egressProxyEnv(url = egressProxyUrl): string[] {
  return [
    `HTTP_PROXY=${url}`,
    `HTTPS_PROXY=${url}`,
    `http_proxy=${url}`,
    `https_proxy=${url}`,
    `NO_PROXY=${noProxy}`,
    `no_proxy=${noProxy}`,
    "NODE_USE_ENV_PROXY=1",
  ];
}

/** The environment every workload gets: where its tenant's upstreams are, and one variable per upstream it had at boot. */
export function upstreamsEnv(names: readonly string[]): string[] {
  return [`${upstreamsUrlEnv}=${upstreamsGuestUrl}`, ...names.map((n) => `${upstreamEnvName(n)}=${upstreamsGuestUrl}/${n}`)];
}
