// `npm start` as a new user runs it: one process, embedded database, a printed curl line that answers 200, clean Ctrl-C.
import { describe, expect, it } from "vitest";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

function childrenOf(pid: number): number[] {
  try {
    return execFileSync("ps", ["-o", "pid=", "--ppid", String(pid)]).toString().split("\n").map((s) => Number(s.trim())).filter(Boolean);
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

describe("npm start", () => {
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
      const curl = out.split("\n").find((l) => l.trim().startsWith("curl "))!.trim();
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
