// Where a VM's guest finds the host's egress proxy: an address of QEMU's user network (10.0.2.0/24) that no other
// service of it uses, forwarded to the proxy by a guestfwd (drivers/qemu/args.ts). The guest's workload learns it as
// `HTTP_PROXY`/`HTTPS_PROXY` (and lowercase, with `NO_PROXY=localhost,127.0.0.1`).
export const EGRESS_PROXY_GUEST_IP = "10.0.2.100";
export const EGRESS_PROXY_GUEST_PORT = 3128;
export const egressProxyUrl = `http://${EGRESS_PROXY_GUEST_IP}:${EGRESS_PROXY_GUEST_PORT}`;

/** The environment a workload with egress gets: the proxy under every name HTTP clients look for it. */
export function egressProxyEnv(url = egressProxyUrl): string[] {
  return [`HTTP_PROXY=${url}`, `HTTPS_PROXY=${url}`, `http_proxy=${url}`, `https_proxy=${url}`, "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1"];
}
