// bench:failover's system: a throwaway Postgres, 3 fleet-agents and 2 standalone gateways in child processes under one temporary directory, and stopping all of it.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ensureDevKeys, mintToken } from "../../../compose/dev-keys.ts";
import { tenants } from "../../../schema/core.ts";
import { openDatabase, type Database } from "../../../schema/db.ts";
import { startPostgres, type PgServer } from "../../postgres-server.ts";
import { stopChild } from "../children.ts";

export const hostIds = ["host_b1", "host_b2", "host_b3"] as const;
export const tenantId = "ten_bench";
const secret = "bench-component-secret-0123456789abcdef";
export const log = (msg: string) => console.error(`[bench-failover] ${msg}`);

interface Child {
  proc: ChildProcess;
  /** What the ready line matched. */
  match: RegExpMatchArray;
  output(): string;
}

export interface ClusterOptions {
  /** The repository's root: the scripts are run from there. */
  root: string;
  /** The temporary directory everything lives under (removed by `cleanUp`). */
  work: string;
  /** The gateways' HOST_LIVE_WINDOW_MS. */
  leaseMs: number;
  /** The hosts' HEARTBEAT_INTERVAL_MS. */
  heartbeatMs: number;
}

export class Cluster {
  readonly gateways: string[] = [];
  private readonly children = new Set<ChildProcess>();
  private readonly hostProcs = new Map<string, Child>();
  private readonly opts: ClusterOptions;
  private pg: PgServer | undefined;
  private database: Database | undefined;
  private cleaning: Promise<void> | undefined;

  constructor(opts: ClusterOptions) {
    this.opts = opts;
  }

  get pgUrl(): string {
    return this.pg!.url;
  }

  get db(): Database["db"] {
    return this.database!.db;
  }

  /** Postgres with the bench's tenant, the hosts and the gateways; the tenant's caller and operator tokens. */
  async start(): Promise<{ token: string; operator: string }> {
    const { work } = this.opts;
    this.pg = await startPostgres();
    const pg = this.pg;
    log(`postgres at ${pg.url}; work dir ${work}`);
    this.database = await openDatabase({ url: pg.url, maxConnections: 4 });
    await this.db.insert(tenants).values({ id: tenantId, name: "bench-failover" });
    const gatewayDir = join(work, "gateway");
    mkdirSync(gatewayDir, { recursive: true });
    const keys = await ensureDevKeys(gatewayDir);
    const token = await mintToken(keys.privateJwk, { tenant: tenantId, scopes: ["agents:invoke", "agents:admin"], ttlS: 24 * 3600 });
    const operator = await mintToken(keys.privateJwk, { tenant: tenantId, scopes: ["operator"], ttlS: 24 * 3600 });

    await Promise.all(hostIds.map((id) => this.startHost(id)));
    for (let i = 0; i < 2; i++) {
      const g = await this.spawnUntil(
        "scripts/gateway.ts",
        {
          DATABASE_URL: pg.url,
          COMPONENT_SECRET: secret,
          DATA_DIR: gatewayDir,
          PORT: "0",
          HOST_LIVE_WINDOW_MS: String(this.opts.leaseMs),
          PLACEMENT_CACHE_MS: "500",
          LOG_LEVEL: "error",
        },
        /gateway listening at (http:\/\/\S+)/,
      );
      this.gateways.push(g.match[1]!);
    }
    return { token, operator };
  }

  /** Starts the host `id` (again: same HOST_ID and data directory); resolves once it serves gateways. */
  async startHost(id: string): Promise<void> {
    this.hostProcs.set(
      id,
      await this.spawnUntil("scripts/fleet-agent.ts", this.hostEnv(id), /fleet-agent (host_[0-9a-z_]+) serving gateways at (http:\/\/\S+)/),
    );
  }

  /** Kills the host `id` with SIGKILL: no hibernation, no goodbye. */
  killHost(id: string): void {
    this.hostProcs.get(id)!.proc.kill("SIGKILL");
  }

  /** Stops every child (SIGTERM, then SIGKILL), what a killed host left running, the database, and removes the directory; once. */
  cleanUp(): Promise<void> {
    this.cleaning ??= (async () => {
      await Promise.all([...this.children].map((c) => stopChild(c, "SIGTERM", 15_000)));
      for (const pid of this.leftoverPids()) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          /* already gone */
        }
      }
      await this.database?.close().catch(() => undefined);
      await this.pg?.stop().catch(() => undefined);
      rmSync(this.opts.work, { recursive: true, force: true });
    })();
    return this.cleaning;
  }

  private hostEnv(id: string): Record<string, string> {
    return {
      DATABASE_URL: this.pgUrl,
      COMPONENT_SECRET: secret,
      DATA_DIR: join(this.opts.work, id),
      HOST_ID: id,
      INGRESS_PORT: "0",
      DRIVER: "process",
      HOST_CAPACITY_MIB: "16384",
      HEARTBEAT_INTERVAL_MS: String(this.opts.heartbeatMs),
      METER_HEARTBEAT_MS: "500",
      REAPER_INTERVAL_MS: "100",
      DRAIN_TIMEOUT_MS: "1000",
    };
  }

  /** Runs `node <script>` from the repository root with `extra` over our environment, resolving once its output matches `ready`. */
  private spawnUntil(script: string, extra: Record<string, string>, ready: RegExp, timeoutMs = 60_000): Promise<Child> {
    const { root } = this.opts;
    const proc = spawn(process.execPath, [join(root, script)], {
      cwd: root,
      env: { ...process.env, LOG_LEVEL: "warn", ...extra },
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.children.add(proc);
    proc.once("exit", () => this.children.delete(proc));
    let out = "";
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${script} not ready within ${timeoutMs} ms:\n${out}`)), timeoutMs);
      const onData = (d: Buffer) => {
        out += d.toString();
        if (out.length > 1 << 20) out = out.slice(-(1 << 19)); // a long run's warnings: keep the tail
        const m = ready.exec(out);
        if (m) {
          clearTimeout(timer);
          resolve({ proc, match: m, output: () => out });
        }
      };
      proc.stdout!.on("data", onData);
      proc.stderr!.on("data", onData);
      proc.once("exit", (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`${script} exited (${code ?? signal}) before it was ready:\n${out}`));
      });
    });
  }

  /**
   * Processes a killed host left running (the process driver's workloads, each in its own process group) that no host
   * restarted after the kill reaped: found by our temporary directory in their command line or environment.
   */
  private leftoverPids(): number[] {
    const pids: number[] = [];
    for (const d of readdirSync("/proc")) {
      if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
      try {
        const text = readFileSync(`/proc/${d}/cmdline`, "latin1") + readFileSync(`/proc/${d}/environ`, "latin1");
        if (text.includes(this.opts.work)) pids.push(Number(d));
      } catch {
        /* ended meanwhile, or not ours to read */
      }
    }
    return pids;
  }
}
