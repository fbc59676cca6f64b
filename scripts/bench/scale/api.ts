// bench:scale's client of the system's API: create agents, call one, hibernate it, read its state, page through the list, and run many at a bounded concurrency.
import { AppError } from "../../../lib/errors.ts";

export interface Api {
  url: string;
  headers: Record<string, string>;
}

export function apiOf(url: string, token: string): Api {
  return { url, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" } };
}

/** Runs `work(i)` for i in [0, count) with at most `concurrency` at once; stops starting new ones once `stop()` is true. */
export async function pool(count: number, concurrency: number, work: (i: number) => Promise<void>, stop: () => boolean = () => false): Promise<number> {
  let next = 0;
  let done = 0;
  const worker = async () => {
    while (next < count && !stop()) {
      const i = next++;
      await work(i);
      done++;
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, count) }, worker));
  return done;
}

export async function createAgent(api: Api, body: Record<string, unknown>): Promise<string> {
  const res = await fetch(`${api.url}/v1/agents`, { method: "POST", headers: api.headers, body: JSON.stringify(body) });
  const text = await res.text();
  if (res.status !== 201) throw new AppError("internal", `create: ${res.status} ${text}`);
  return (JSON.parse(text) as { id: string }).id;
}

/** A call to the agent (`GET /counter` through the proxy): status, ms to the response's headers (its first byte), the wake kind and server-timing. */
export async function callAgent(api: Api, id: string, timeoutMs = 120_000) {
  const t0 = performance.now();
  const res = await fetch(`${api.url}/a/${id}/counter`, { headers: api.headers, signal: AbortSignal.timeout(timeoutMs) });
  const firstByteMs = performance.now() - t0;
  const text = await res.text();
  const restore = /restore;dur=([\d.]+)(?:;desc=(\w+))?/.exec(res.headers.get("server-timing") ?? "");
  return {
    status: res.status,
    firstByteMs,
    wake: res.headers.get("x-wake") ?? "",
    restoreMs: restore ? Number(restore[1]) : undefined,
    /** A restore's sleep tier (kept, prestarted, files). */
    tier: restore?.[2],
    text,
  };
}

/** Hibernates the agent through the API; resolves once the API answered (the snapshot taken). */
export async function hibernateAgent(api: Api, id: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const res = await fetch(`${api.url}/v1/agents/${id}/hibernate`, { method: "POST", headers: api.headers, signal: AbortSignal.timeout(120_000) });
    const text = await res.text();
    if (res.status === 200) return;
    // 409 while a call is still in flight (its response closing): once more a moment later.
    if (res.status === 409 && attempt < 20) {
      await new Promise((r) => setTimeout(r, 100));
      continue;
    }
    throw new AppError("internal", `hibernate ${id}: ${res.status} ${text}`);
  }
}

export async function agentState(api: Api, id: string): Promise<string> {
  const res = await fetch(`${api.url}/v1/agents/${id}`, { headers: api.headers });
  const text = await res.text();
  if (res.status !== 200) throw new AppError("internal", `get ${id}: ${res.status} ${text}`);
  return (JSON.parse(text) as { state: string }).state;
}

/** Pages through every agent `limit` at a time: each page's time, ms, and the agents seen. */
export async function pageAll(api: Api, limit: number): Promise<{ pageMs: number[]; seen: number }> {
  const pageMs: number[] = [];
  let seen = 0;
  let cursor: string | null = null;
  do {
    const t0 = performance.now();
    const res: Response = await fetch(`${api.url}/v1/agents?limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`, { headers: api.headers });
    const text = await res.text();
    pageMs.push(performance.now() - t0);
    if (res.status !== 200) throw new AppError("internal", `list: ${res.status} ${text}`);
    const page = JSON.parse(text) as { agents: unknown[]; nextCursor: string | null };
    seen += page.agents.length;
    cursor = page.nextCursor;
  } while (cursor);
  return { pageMs, seen };
}
