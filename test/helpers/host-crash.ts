// A gateway and a fleet-agent as separate processes over real Postgres, where the fleet-agent can be killed with
// SIGKILL and started again on the same data directory and port (same host id, same ingress URL).
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ensureDevKeys, mintToken } from "../../compose/dev-keys.ts";
import { endLeftoverVms } from "./leftovers.ts";
import { meterDir } from "../../fleet-agent/meter/spool.ts";
import { freeLoopbackPort } from "../../lib/node-net.ts";
import { tenants } from "../../schema/core.ts";
import { freshDatabase } from "./db.ts";
import { spawnNode, testComponentSecret, type Child } from "./worker-stack.ts";

export interface RunJson {
  runId: string;
  wokeAt: string;
  wakeMode: string;
  timings: Record<string, number>;
  sleptAt: string | null;
  sleepReason: string | null;
}

export interface EventJson {
  fromState: string;
  toState: string;
  reason: string;
  runId: string | null;
  timings: Record<string, number> | null;
  detail: Record<string, unknown> | null;
}

export interface CrashStack {
  database: Awaited<ReturnType<typeof freshDatabase>>;
  hostId: string;
  dataDir: string;
  /** The host's VM state directories (`<vmsDir>/<agentId>`). */
  vmsDir: string;
  /** SIGKILL of the fleet-agent process; answers the wall clock just before the signal. */
  killHost(): Promise<number>;
  /** SIGTERM of the fleet-agent process: its shutdown (drain, hibernations), waited for. */
  stopHost(): Promise<void>;
  /** Starts the fleet-agent again on the same data directory and port; `env` over the stack's `hostEnv` for this start. */
  startHost(env?: Record<string, string>): Promise<void>;
  call(path: string, init?: RequestInit): Promise<Response>;
  createAgent(body?: Record<string, unknown>): Promise<string>;
  runs(agentId: string): Promise<RunJson[]>;
  /** Oldest first. */
  events(agentId: string): Promise<EventJson[]>;
  agentState(agentId: string): Promise<string>;
  /**
   * Where the meter spool on disk says a run's metering stopped: the end of its last segment still in the file, or
   * the checkpoint's last end of the VM when that is the run's (segments shipped and trimmed). Read while the host is down.
   */
  lastMeteredEnd(vmId: string, runId: string): number | undefined;
  close(): Promise<void>;
}

export async function startCrashStack(opts: {
  hostEnv: Record<string, string>;
  readyTimeoutMs?: number;
  /** Called with the host's data directory before its first start. */
  prepare?: (dataDir: string) => void;
  /** Called at close once the processes have ended, before the data directory is removed (to unmount what `prepare` mounted). */
  unprepare?: () => void;
}): Promise<CrashStack> {
  const database = await freshDatabase();
  const dataDir = mkdtempSync(join(tmpdir(), "agentvm-crash-"));
  const gatewayDir = mkdtempSync(join(tmpdir(), "agentvm-crash-gw-"));
  const port = await freeLoopbackPort();
  opts.prepare?.(dataDir);
  let host: (Child & { match: RegExpMatchArray }) | undefined;
  let gateway: (Child & { match: RegExpMatchArray }) | undefined;
  const startHost = async (env: Record<string, string> = {}) => {
    host = await spawnNode(
      "scripts/fleet-agent.ts",
      {
        DATABASE_URL: database.url,
        COMPONENT_SECRET: testComponentSecret,
        DATA_DIR: dataDir,
        INGRESS_PORT: String(port),
        HEARTBEAT_INTERVAL_MS: "500",
        DRAIN_TIMEOUT_MS: "2000",
        ...opts.hostEnv,
        ...env,
      },
      /fleet-agent (host_[0-9a-z]+) serving gateways at (http:\/\/\S+)/,
      opts.readyTimeoutMs,
    );
  };
  await startHost();
  const hostId = host!.match[1]!;
  const keys = await ensureDevKeys(gatewayDir);
  gateway = await spawnNode(
    "scripts/gateway.ts",
    { DATABASE_URL: database.url, COMPONENT_SECRET: testComponentSecret, DATA_DIR: gatewayDir, PORT: "0", AGENT_IMAGES: "demo", LOG_LEVEL: "error" },
    /gateway listening at (http:\/\/\S+)/,
  );
  const gatewayUrl = gateway.match[1]!;
  const token = await mintToken(keys.privateJwk, { tenant: "ten_crash", scopes: ["agents:invoke", "agents:admin", "usage:read"] });
  await database.db.insert(tenants).values({ id: "ten_crash", name: "crash" });

  const call = (path: string, init: RequestInit = {}) => {
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${token}`);
    return fetch(gatewayUrl + path, { ...init, headers });
  };
  const json = async <T>(path: string): Promise<T> => {
    const res = await call(path);
    if (res.status !== 200) throw new Error(`${path} answered ${res.status}: ${await res.text()}`);
    return (await res.json()) as T;
  };
  const vmsDir = join(dataDir, "hosts", hostId, "vms");
  return {
    database,
    hostId,
    dataDir,
    vmsDir,
    async killHost() {
      const proc = host!.proc;
      const exited = new Promise((resolve) => proc.once("exit", resolve));
      const at = Date.now();
      proc.kill("SIGKILL");
      await exited;
      return at;
    },
    async stopHost() {
      await host!.stop();
    },
    startHost,
    call,
    async createAgent(body = {}) {
      const res = await call("/v1/agents", { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } });
      if (res.status !== 201) throw new Error(`create answered ${res.status}: ${await res.text()}`);
      return ((await res.json()) as { id: string }).id;
    },
    async runs(agentId) {
      return (await json<{ runs: RunJson[] }>(`/v1/agents/${agentId}/runs`)).runs;
    },
    async events(agentId) {
      return (await json<{ events: EventJson[] }>(`/v1/agents/${agentId}/events`)).events.reverse();
    },
    async agentState(agentId) {
      return (await json<{ state: string }>(`/v1/agents/${agentId}`)).state;
    },
    lastMeteredEnd(vmId, runId) {
      const file = join(meterDir(dataDir, hostId), "segments.ndjson");
      let end: number | undefined;
      for (const line of readFileSync(file, "utf8").split("\n")) {
        if (!line.trim()) continue;
        let v: { checkpoint?: { ends?: Record<string, { runId: string; endedAt: string }> }; vmId?: string; runId?: string; endedAt?: string };
        try {
          v = JSON.parse(line);
        } catch {
          continue; // a torn last line
        }
        const e = v.checkpoint ? v.checkpoint.ends?.[vmId] : v.vmId === vmId ? { runId: v.runId!, endedAt: v.endedAt! } : undefined;
        if (e?.runId === runId) end = Math.max(end ?? -Infinity, Date.parse(e.endedAt));
      }
      return end;
    },
    async close() {
      await gateway?.stop();
      await host?.stop();
      await endLeftoverVms(vmsDir);
      await database.close();
      opts.unprepare?.();
      rmSync(dataDir, { recursive: true, force: true });
      rmSync(gatewayDir, { recursive: true, force: true });
    },
  };
}
