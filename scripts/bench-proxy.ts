// `npm run bench:proxy`: what the gateway's data path costs, side by side with a direct call and nginx, under wrk.
//
// One run, same upstream (the demo workload, `GET /`: a small JSON answer), same request mix, keep-alive, a fixed
// connection count, each target loaded for BENCH_SECONDS after a short warm-up:
//   (a) direct to an upstream process,
//   (b) through the gateway started as `npm start` starts it (its own process, embedded database, process driver),
//       to its warm demo agent (the same workload), with a bearer token,
//   (c) through nginx `proxy_pass` with upstream keepalive (one worker, like the gateway's one event loop),
//   (d) through a bare Node TCP relay (bench/byte-relay.ts: bytes passed on unread, no HTTP at all): the floor of any
//       proxy written on Node, so the run says how much of the gap to nginx is the gateway's and how much Node's.
// Prints one table and, last, `RESULT {json}`. Everything listens on loopback; every child is stopped at the end.
//
// | variable | default | meaning |
// | BENCH_SECONDS | 10 | load duration per target, s |
// | BENCH_CONNECTIONS | 32 | concurrent keep-alive connections |
// | BENCH_THREADS | 1 | wrk threads |
// | BENCH_NGINX_WORKERS | 1 | nginx worker processes |
// | BENCH_PROFILE | (unset) | a directory: the gateway runs with --cpu-prof and writes its profile there |
// | BENCH_TARGETS | direct,nginx,gateway,relay | which targets to load (the RESULT ratios need direct, nginx and gateway) |
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { int, optStr } from "../lib/env.ts";
import { startSystem, type StartedSystem } from "./bench-start.ts";
import { stopChild } from "./bench/children.ts";
import { printResult, round } from "./bench/figures.ts";
import { freePort } from "./postgres-server.ts";

const env = process.env;
const seconds = int(env, "BENCH_SECONDS", 10, { min: 1, max: 600 });
const connections = int(env, "BENCH_CONNECTIONS", 32, { min: 1, max: 10_000 });
const threads = int(env, "BENCH_THREADS", 1, { min: 1, max: 64 });
const nginxWorkers = int(env, "BENCH_NGINX_WORKERS", 1, { min: 1, max: 64 });
const profileDir = optStr(env, "BENCH_PROFILE");
const targets = new Set((optStr(env, "BENCH_TARGETS") ?? "direct,nginx,gateway,relay").split(",").map((t) => t.trim()));
const root = fileURLToPath(new URL("..", import.meta.url));
const demo = join(root, "fleet-agent/workloads/demo.ts");
const byteRelay = join(root, "scripts/bench/byte-relay.ts");
const work = mkdtempSync(join(tmpdir(), "agentvm-bench-"));
const children: ChildProcess[] = [];
let gatewayOutput = "";

interface Load {
  rps: number;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  non2xx: number;
  /** CPU the proxy process used per request, µs (undefined for the direct run). */
  proxyCpuUsPerReq?: number;
}

function which(cmd: string): string | undefined {
  for (const dir of (env.PATH ?? "").split(":").concat(["/usr/sbin", "/usr/bin", "/sbin"])) {
    const p = join(dir, cmd);
    if (existsSync(p)) return p;
  }
  return undefined;
}

async function waitForPort(port: number, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    const ok = await new Promise<boolean>((r) => {
      const s = createServer();
      s.once("error", () => r(true)); // in use: someone listens
      s.listen(port, "127.0.0.1", () => s.close(() => r(false)));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listened on ${port} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function cpuTicks(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  return Number(fields[11]) + Number(fields[12]); // utime + stime, in clock ticks (100 Hz)
}

function ms(v: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(v.trim());
  if (!m) return NaN;
  const n = Number(m[1]);
  return m[2] === "us" ? n / 1000 : m[2] === "ms" ? n : m[2] === "s" ? n * 1000 : n * 60_000;
}

/** Loads `url` with wrk for `duration` s; `cpuPid` is the proxy process whose CPU per request is reported. */
function wrk(wrkPath: string, url: string, duration: number, headers: string[], cpuPid?: number): Load {
  const before = cpuPid ? cpuTicks(cpuPid) : 0;
  const args = [`-t${threads}`, `-c${connections}`, `-d${duration}s`, "--latency", ...headers.flatMap((h) => ["-H", h]), url];
  const out = spawnSync(wrkPath, args, { encoding: "utf8" });
  if (out.status !== 0) throw new Error(`wrk failed: ${out.stderr || out.stdout}`);
  const text = out.stdout;
  const total = Number(/(\d+) requests in/.exec(text)?.[1] ?? 0);
  const load: Load = {
    rps: Number(/Requests\/sec:\s+([\d.]+)/.exec(text)?.[1] ?? 0),
    p50Ms: ms(/\s50%\s+(\S+)/.exec(text)?.[1] ?? ""),
    p99Ms: ms(/\s99%\s+(\S+)/.exec(text)?.[1] ?? ""),
    errors: [...text.matchAll(/(connect|read|write|timeout) (\d+)/g)].reduce((s, m) => s + Number(m[2]), 0),
    non2xx: Number(/Non-2xx or 3xx responses: (\d+)/.exec(text)?.[1] ?? 0),
  };
  if (cpuPid && total > 0) load.proxyCpuUsPerReq = Math.round((((cpuTicks(cpuPid) - before) * 10_000) / total) * 10) / 10;
  return load;
}

function startDemoUpstream(port: number): ChildProcess {
  const child = spawn(process.execPath, [demo], { env: { ...env, PORT: String(port) }, stdio: "ignore" });
  children.push(child);
  return child;
}

async function startRelay(upstreamPort: number, port: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, [byteRelay, String(port), String(upstreamPort)], { stdio: "ignore" });
  children.push(child);
  await waitForPort(port, 10_000);
  return child;
}

async function startNginx(upstreamPort: number, port: number): Promise<ChildProcess | undefined> {
  const nginx = which("nginx");
  if (!nginx) return undefined;
  const dir = join(work, "nginx");
  mkdirSync(join(dir, "temp"), { recursive: true });
  // As root, nginx's workers drop to an unprivileged user; that user must exist with its group.
  const groups = readFileSync("/etc/group", "utf8");
  const user = process.getuid?.() === 0 ? `user nobody ${/^nogroup:/m.test(groups) ? "nogroup" : "nobody"};` : "";
  const conf = `${user}
worker_processes ${nginxWorkers};
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path ${dir}/temp/body;
  proxy_temp_path ${dir}/temp/proxy;
  fastcgi_temp_path ${dir}/temp/fastcgi;
  uwsgi_temp_path ${dir}/temp/uwsgi;
  scgi_temp_path ${dir}/temp/scgi;
  upstream agent { server 127.0.0.1:${upstreamPort}; keepalive ${Math.max(64, connections)}; }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://agent;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $host;
    }
  }
}
`;
  writeFileSync(join(dir, "nginx.conf"), conf);
  const child = spawn(nginx, ["-c", join(dir, "nginx.conf"), "-p", dir], { stdio: "ignore" });
  children.push(child);
  await waitForPort(port, 10_000);
  return child;
}

/** The gateway as `npm start` runs it, in its own process. */
async function startGateway(): Promise<StartedSystem> {
  const nodeFlags = profileDir ? ["--cpu-prof", `--cpu-prof-dir=${resolve(profileDir)}`] : [];
  return startSystem({
    root,
    dataDir: join(work, "data"),
    env,
    nodeFlags,
    onSpawn: (child) => children.push(child),
    onOutput: (text) => (gatewayOutput += text),
  });
}

async function stopAll(): Promise<void> {
  for (const c of children.reverse()) await stopChild(c, c.spawnfile.endsWith("nginx") ? "SIGQUIT" : "SIGINT", 10_000);
  rmSync(work, { recursive: true, force: true });
}

function ensureTools(): string {
  let wrkPath = which("wrk");
  if (!wrkPath && process.getuid?.() === 0) {
    console.log("installing wrk and nginx (apt-get)…");
    spawnSync("apt-get", ["install", "-y", "wrk", "nginx"], { stdio: "inherit" });
    wrkPath = which("wrk");
  }
  if (!wrkPath) throw new Error("wrk is needed (apt-get install wrk); this benchmark does not run without a real load generator");
  return wrkPath;
}

async function main(): Promise<void> {
  const wrkPath = ensureTools();
  const upstreamPort = await freePort();
  const nginxPort = await freePort();
  startDemoUpstream(upstreamPort);
  await waitForPort(upstreamPort, 15_000);
  const nginx = await startNginx(upstreamPort, nginxPort);
  const relayPort = await freePort();
  const relay = targets.has("relay") ? await startRelay(upstreamPort, relayPort) : undefined;
  const gateway = await startGateway();
  const auth = [`Authorization: Bearer ${gateway.token}`];
  const gatewayUrl = `${gateway.url}/a/agt_demo/`;
  const first = await fetch(gatewayUrl, { headers: { authorization: `Bearer ${gateway.token}` } });
  if (first.status !== 200) throw new Error(`gateway answered ${first.status}: ${await first.text()}`);
  // A warm agent: a keep-awake lease holds it up while the other targets are measured (its idle timeout is 15 s).
  const lease = await fetch(`${gateway.url}/v1/agents/agt_demo/leases`, {
    method: "POST",
    headers: { authorization: `Bearer ${gateway.token}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 3600_000 }),
  });
  if (lease.status !== 201) throw new Error(`lease: ${lease.status} ${await lease.text()}`);
  const warm = Math.min(5, seconds);

  console.log(
    `wrk -t${threads} -c${connections}, ${seconds} s per target after ${warm} s of warm-up; upstream: the demo workload's GET / (${(await first.text()).length} bytes)`,
  );
  const results: Record<string, Load | undefined> = {};
  const direct = `http://127.0.0.1:${upstreamPort}/`;
  // The gateway first, right after its warm-up. (Measured first by habit: the idle-then-loaded GC penalty that
  // made the order matter, a long-lived Set of tickets in the host, is gone — tickets live in an array now.)
  if (targets.has("gateway")) {
    wrk(wrkPath, gatewayUrl, warm, auth);
    results.gateway = wrk(wrkPath, gatewayUrl, seconds, auth, gateway.child.pid);
  }
  if (targets.has("direct")) {
    wrk(wrkPath, direct, warm, auth);
    results.direct = wrk(wrkPath, direct, seconds, auth);
  }
  if (nginx && targets.has("nginx")) {
    const url = `http://127.0.0.1:${nginxPort}/`;
    const worker = spawnSync("pgrep", ["-P", String(nginx.pid)], { encoding: "utf8" })
      .stdout.trim()
      .split("\n")[0];
    wrk(wrkPath, url, warm, auth);
    results.nginx = wrk(wrkPath, url, seconds, auth, worker ? Number(worker) : undefined);
  }
  if (relay) {
    const url = `http://127.0.0.1:${relayPort}/`;
    wrk(wrkPath, url, warm, auth);
    results.relay = wrk(wrkPath, url, seconds, auth, relay.pid);
  }

  console.log("\ntarget    req/s      p50 ms   p99 ms   proxy CPU µs/req   errors  non-2xx");
  for (const [name, r] of Object.entries(results)) {
    if (!r) continue;
    console.log(
      `${name.padEnd(9)} ${r.rps.toFixed(0).padStart(8)}  ${r.p50Ms.toFixed(2).padStart(7)}  ${r.p99Ms.toFixed(2).padStart(7)}  ${(r.proxyCpuUsPerReq?.toFixed(1) ?? "-").padStart(17)}  ${String(r.errors).padStart(6)}  ${String(r.non2xx).padStart(7)}`,
    );
  }
  const none: Load = { rps: NaN, p50Ms: NaN, p99Ms: NaN, errors: 0, non2xx: 0 };
  const d = results.direct ?? none;
  const g = results.gateway ?? none;
  const n = results.nginx;
  const r = results.relay;
  const result = {
    direct_rps: Math.round(d.rps),
    gateway_rps: Math.round(g.rps),
    nginx_rps: n ? Math.round(n.rps) : null,
    gateway_vs_direct: round(g.rps / d.rps, 3),
    gateway_vs_nginx: n ? round(g.rps / n.rps, 3) : null,
    gateway_p99_ms: round(g.p99Ms, 2),
    direct_p99_ms: round(d.p99Ms, 2),
    nginx_p99_ms: n ? round(n.p99Ms, 2) : null,
    gateway_cpu_us_per_req: g.proxyCpuUsPerReq ?? null,
    nginx_cpu_us_per_req: n?.proxyCpuUsPerReq ?? null,
    relay_rps: r ? Math.round(r.rps) : null,
    relay_vs_nginx: r && n ? round(r.rps / n.rps, 3) : null,
    relay_cpu_us_per_req: r?.proxyCpuUsPerReq ?? null,
    gateway_errors: g.errors + g.non2xx,
    connections,
    threads,
    seconds,
  };
  if (env.BENCH_DEBUG) console.log(`gateway output:\n${gatewayOutput.slice(-3000)}`);
  await stopAll();
  printResult(result);
}

main().catch(async (err: unknown) => {
  console.error(err instanceof Error ? err.message : String(err));
  await stopAll().catch(() => undefined);
  process.exit(1);
});
