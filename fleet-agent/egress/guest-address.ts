// Where a VM's guest finds the host's egress proxy: an address of QEMU's user network (10.0.2.0/24) that no other
// service of it uses, forwarded to the proxy by a guestfwd (drivers/qemu/args.ts). The guest's workload learns it as
// `HTTP_PROXY`/`HTTPS_PROXY` (and lowercase, with `NO_PROXY`), plus `NODE_USE_ENV_PROXY=1` (`egressProxyEnv`).
export const EGRESS_PROXY_GUEST_IP = "10.0.2.100";
export const EGRESS_PROXY_GUEST_PORT = 3128;
export const egressProxyUrl = `http://${EGRESS_PROXY_GUEST_IP}:${EGRESS_PROXY_GUEST_PORT}`;

/**
 * The environment a workload with egress gets: the proxy under every name HTTP clients look for it, and what makes
 * the common runtimes use it. Checked: Node ≥ 24's built-in `fetch` and `http`/`https` go direct unless
 * `NODE_USE_ENV_PROXY=1` (with it, `fetch` tunnels plain HTTP too with `CONNECT`: tried on Node 24.21); Python's
 * `requests`, `httpx` and `urllib`, Go's `net/http`, Deno and Bun read `HTTP(S)_PROXY`/`NO_PROXY` (either case) as
 * they are; curl reads `https_proxy`/`HTTPS_PROXY` but only the lowercase `http_proxy` (hence both cases). Not
 * reachable by the environment: aiohttp (only with `trust_env=True` in the code), the JVM (system properties; a
 * `JAVA_TOOL_OPTIONS` here would replace the image's own and print a line on every start). `NO_PROXY` also names the
 * proxy's own address: what a workload calls at the proxy itself (`http://<proxy>/…`) goes to it in origin form, not
 * through it as a proxy to itself.
 */
export function egressProxyEnv(url = egressProxyUrl): string[] {
  const noProxy = `localhost,127.0.0.1,${new URL(url).hostname}`;
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
