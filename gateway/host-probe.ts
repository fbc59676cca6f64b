// Whether a gateway can reach a host's ingress: its `/healthz` answers 200 with the host's own id (runtime-free: fetch).
import type { HostProbe } from "./placement.ts";

/**
 * A probe over `fetch`. The id must match: a URL where another host (or nothing of ours) answers is as unreachable as
 * one where nothing listens, since calls there would be refused as another host's.
 */
export function createFetchProbe(opts: { timeoutMs?: number; fetch?: (req: Request) => Promise<Response> } = {}): HostProbe {
  const timeoutMs = opts.timeoutMs ?? 1000;
  const doFetch = opts.fetch ?? ((req: Request) => fetch(req));
  return async (host) => {
    const url = `${host.url.endsWith("/") ? host.url : `${host.url}/`}healthz`;
    try {
      const res = await doFetch(new Request(url, { signal: AbortSignal.timeout(timeoutMs) }));
      if (res.status !== 200) {
        await res.body?.cancel();
        return false;
      }
      const body = (await res.json()) as { hostId?: unknown };
      return body.hostId === host.id;
    } catch {
      return false;
    }
  };
}
