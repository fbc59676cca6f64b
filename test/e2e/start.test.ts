// `npm start` as a new user runs it: one process, embedded database, a printed curl line that answers 200, clean Ctrl-C.
import { describe, expect, it } from "vitest";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

function childrenOf(pid: number): number[] {
  try {
    return execFileSync("ps", ["-o", "pid=", "--ppid", String(pid)])
      .toString()
      .split("\n")
      .map((s) => Number(s.trim()))
      .filter(Boolean);
  } catch {
    return [];
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return !readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z");
  } catch {
    return false;
  }
}

/** `npm start` (process driver) in a data directory of its own; resolves once its banner is printed. */
async function startNpmStart(dataDir: string) {
  const child = spawn(process.execPath, ["scripts/start.ts"], {
    env: { ...process.env, DATA_DIR: dataDir, PORT: "0", DRIVER: "process", LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const state = { out: "" };
  child.stdout.on("data", (d: Buffer) => (state.out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (state.out += d.toString()));
  const deadline = Date.now() + 60_000;
  while (!state.out.includes("Stop with Ctrl-C")) {
    if (child.exitCode !== null) throw new Error(`start exited early: ${state.out}`);
    if (Date.now() > deadline) throw new Error(`start printed no banner in 60 s: ${state.out}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const base = /gateway\s+(http:\/\/127\.0\.0\.1:\d+)/.exec(state.out)![1]!;
  const token = /token\s+(\S+)/.exec(state.out)![1]!;
  return { child, state, base, token };
}

describe("npm start", () => {
  it("keeps listening while it drains on SIGTERM: a new call gets 503 shutting_down with Retry-After, the call in flight finishes", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "agentvm-start-"));
    const { child, state, base, token } = await startNpmStart(dataDir);
    try {
      const auth = { authorization: `Bearer ${token}` };
      expect((await fetch(`${base}/a/agt_demo/counter`, { method: "POST", headers: auth })).status).toBe(200);
      const inFlight = fetch(`${base}/a/agt_demo/slow?ms=2500`, { headers: auth }).then(async (r) => ({ status: r.status, body: await r.text() }));
      await new Promise((r) => setTimeout(r, 300));
      child.kill("SIGTERM");
      await new Promise((r) => setTimeout(r, 500));
      const during = await fetch(`${base}/a/agt_demo/counter`, { method: "POST", headers: auth });
      expect(during.status).toBe(503);
      expect(during.headers.get("retry-after")).toBe("5");
      expect(((await during.json()) as { error: { code: string } }).error.code).toBe("shutting_down");
      const api = await fetch(`${base}/v1/agents`, { headers: auth });
      expect(api.status).toBe(503); // the control API too: nothing new starts while draining
      const finished = await inFlight;
      expect(finished).toEqual({ status: 200, body: '{"slept":2500}' });
      const code = await new Promise<number | null>((r) => (child.exitCode !== null ? r(child.exitCode) : child.once("exit", (c) => r(c))));
      expect(code, state.out).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it("prints a curl line that wakes the demo agent, and stops cleanly on SIGINT leaving no child process", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "agentvm-start-"));
    const child = spawn(process.execPath, ["scripts/start.ts"], {
      env: { ...process.env, DATA_DIR: dataDir, PORT: "0", DRIVER: "process", LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (out += d.toString()));
    try {
      const deadline = Date.now() + 60_000;
      while (!out.includes("Stop with Ctrl-C")) {
        if (child.exitCode !== null) throw new Error(`start exited early: ${out}`);
        if (Date.now() > deadline) throw new Error(`start printed no banner in 60 s: ${out}`);
        await new Promise((r) => setTimeout(r, 100));
      }
      expect(out).toMatch(/demo agent\s+http:\/\/127\.0\.0\.1:\d+\/a\/agt_demo\//);
      const curl = out
        .split("\n")
        .find((l) => l.trim().startsWith("curl "))!
        .trim();
      expect(curl).toContain("Authorization: Bearer ");
      const answer = execFileSync("bash", ["-c", `${curl} -s -w ' %{http_code}'`]).toString();
      expect(answer).toBe('{"count":1} 200');
      const kids = childrenOf(child.pid!);
      expect(kids.length).toBeGreaterThan(0); // the demo workload

      child.kill("SIGINT");
      const code = await new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
      expect(code).toBe(0);
      for (const pid of kids) expect(alive(pid)).toBe(false);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
