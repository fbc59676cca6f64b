// A throwaway Postgres server from the system's binaries, in a temporary directory, on a free loopback port.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, chownSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freeLoopbackPort } from "../lib/node-net.ts";

export function findPgBin(): string | undefined {
  const root = "/usr/lib/postgresql";
  if (existsSync(root)) {
    const versions = readdirSync(root)
      .filter((v) => existsSync(join(root, v, "bin", "initdb")))
      .sort((a, b) => Number(b) - Number(a));
    if (versions[0]) return join(root, versions[0], "bin");
  }
  return undefined;
}

/** A free loopback port (what the throwaway server and tests listen on). */
export const freePort = freeLoopbackPort;

export interface PgServer {
  url: string;
  /** Stops the server for good and removes its directory. */
  stop(): Promise<void>;
  /** Stops the server (fast shutdown: sessions are ended) and keeps its data, for `restart` (outage tests). */
  halt(): Promise<void>;
  /** Starts a halted server again on the same port and data. */
  restart(): Promise<void>;
}

/** initdb refuses to run as root: run the server as the `postgres` system user then. */
function runAs(): { uid: number; gid: number; user: string } | undefined {
  if (process.getuid?.() !== 0) return undefined;
  for (const user of ["postgres", "nobody"]) {
    try {
      const uid = Number(execFileSync("id", ["-u", user]).toString().trim());
      const gid = Number(execFileSync("id", ["-g", user]).toString().trim());
      return { uid, gid, user };
    } catch {
      /* try the next */
    }
  }
  throw new Error("running as root and neither a postgres nor a nobody user exists to run the server");
}

export interface PgServerOptions {
  /**
   * Keep Postgres's durable defaults (`fsync`, `synchronous_commit`, `full_page_writes` on), for benchmarks whose
   * figures must hold on a real server. Default false: tests run with all three off, which is faster and loses
   * nothing a throwaway server needs.
   */
  durable?: boolean;
}

export async function startPostgres(opts: PgServerOptions = {}): Promise<PgServer> {
  const bin = findPgBin();
  if (!bin) throw new Error("no Postgres server binaries (initdb) found: run `node scripts/provision.ts` as root, or apt-get install postgresql");
  const dir = mkdtempSync(join(tmpdir(), "agentvm-pg-"));
  const data = join(dir, "data");
  const port = await freePort();
  const as = runAs();
  if (as) chownSync(dir, as.uid, as.gid);
  const runOpts = as ? { uid: as.uid, gid: as.gid } : {};
  execFileSync(join(bin, "initdb"), ["-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"], { ...runOpts, stdio: "pipe" });
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  const fast = opts.durable ? [] : ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"];
  const args = ["-D", data, "-p", String(port), "-k", dir, "-c", "listen_addresses=127.0.0.1", ...fast, "-c", "max_connections=300"];
  let child = await run(join(bin, "postgres"), args, runOpts);
  const halt = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGINT");
      await new Promise<void>((r) => child.once("exit", () => r()));
    }
  };
  return {
    url,
    halt,
    async restart() {
      await halt();
      child = await run(join(bin, "postgres"), args, runOpts);
    },
    async stop() {
      await halt();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Spawns the server and resolves once it accepts connections (20 s at most). */
async function run(postgresBin: string, args: string[], opts: { uid?: number; gid?: number }): Promise<ChildProcess> {
  const child = spawn(postgresBin, args, { ...opts, stdio: ["ignore", "ignore", "pipe"], detached: false });
  let log = "";
  child.stderr?.on("data", (d: Buffer) => (log += d.toString()));
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`postgres exited: ${log}`);
    if (log.includes("ready to accept connections")) return child;
    if (Date.now() > deadline) throw new Error(`postgres did not start in 20 s: ${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
