// The gateway Worker in workerd (wrangler's unstable_startWorker, from wrangler.toml) with Hyperdrive pointed at a test database.
import { unstable_startWorker } from "wrangler";
import { join } from "node:path";
import { repoRoot } from "./worker-stack.ts";

export interface WorkerUnderTest {
  url: string;
  /** fetch() to the Worker through workerd's HTTP server. */
  fetch(path: string, init?: RequestInit): Promise<Response>;
  /** Runs the Worker's `scheduled` handler (a cron tick) and waits for it. */
  cron(): Promise<void>;
  close(): Promise<void>;
}

/** Offline and quiet: no telemetry, no `Request.cf` download (WORKER_TEST_LOGS=1 shows the Worker's console). */
export function quietWrangler(): void {
  process.env.WRANGLER_SEND_METRICS = "false";
  process.env.CLOUDFLARE_CF_FETCH_ENABLED = "false";
}

/** postgres.js needs a password in Hyperdrive's connection string; the test server trusts any. */
export function withPassword(pgUrl: string): string {
  const u = new URL(pgUrl);
  if (!u.password) u.password = "test";
  return u.href;
}

/**
 * Not wrangler's createTestHarness: it sends the Worker's outbound fetches through Node's fetch (which follows
 * redirects and decodes bodies), while startWorker leaves them to workerd, as in production.
 */
export async function startWorker(opts: { pgUrl: string; vars?: Record<string, string>; secrets?: Record<string, string> }): Promise<WorkerUnderTest> {
  quietWrangler();
  // Read by wrangler when it builds the bindings: it wins over wrangler.toml's localConnectionString.
  process.env.CLOUDFLARE_HYPERDRIVE_LOCAL_CONNECTION_STRING_HYPERDRIVE = withPassword(opts.pgUrl);
  const bindings: Record<string, { type: "plain_text" | "secret_text"; value: string }> = {};
  for (const [name, value] of Object.entries(opts.vars ?? {})) bindings[name] = { type: "plain_text", value };
  for (const [name, value] of Object.entries(opts.secrets ?? {})) bindings[name] = { type: "secret_text", value };
  const worker = await unstable_startWorker({
    config: join(repoRoot, "wrangler.toml"),
    bindings,
    dev: {
      server: { hostname: "127.0.0.1", port: 0 },
      inspector: false,
      watch: false,
      persist: false,
      logLevel: process.env.WORKER_TEST_LOGS ? "log" : "none",
      testScheduled: true,
    },
  });
  await worker.ready;
  const url = await worker.url;
  return {
    url: url.href.replace(/\/$/, ""),
    fetch: (path, init) => fetch(new URL(path, url), init),
    async cron() {
      // `testScheduled` serves this route: it runs the scheduled handler and answers when it has finished.
      const res = await fetch(new URL("/__scheduled?cron=*+*+*+*+*", url));
      if (res.status !== 200) throw new Error(`scheduled run failed: ${res.status} ${await res.text()}`);
      await res.body?.cancel();
    },
    close: () => worker.dispose(),
  };
}
