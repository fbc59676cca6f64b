// `npm start` on real VMs: Ctrl-C (SIGINT to the whole process group, as a terminal sends it) snapshots the demo
// agent; the next start restores it with its memory — the counter goes on — and leaves no QEMU behind.
import { describe, expect, it } from "vitest";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

async function start(dataDir: string): Promise<{ child: ChildProcess; curl: string; output: () => string }> {
  // detached: the child leads its own process group, like a shell's foreground job.
  const child = spawn(process.execPath, ["scripts/start.ts"], {
    env: { ...process.env, DATA_DIR: dataDir, PORT: "0", DRIVER: "qemu", LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  const deadline = Date.now() + 120_000;
  while (!out.includes("Stop with Ctrl-C")) {
    if (child.exitCode !== null) throw new Error(`start exited early: ${out}`);
    if (Date.now() > deadline) throw new Error(`no banner in 120 s: ${out}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  expect(out).toContain("driver: qemu");
  return {
    child,
    curl: out
      .split("\n")
      .find((l) => l.trim().startsWith("curl "))!
      .trim(),
    output: () => out,
  };
}

async function ctrlC(child: ChildProcess): Promise<number | null> {
  const exited = new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
  process.kill(-child.pid!, "SIGINT");
  return exited;
}

function qemusUsing(dataDir: string): number {
  const r = spawnSync("pgrep", ["-f", `qemu-system-x86_64.*${dataDir}`]);
  return r.stdout.toString().trim().split("\n").filter(Boolean).length;
}

const title = qemuPresent
  ? "npm start with the qemu driver"
  : "npm start with the qemu driver — skipped: qemu-system-x86_64 is not installed (npm run setup:vm)";
describe.skipIf(!qemuPresent)(title, () => {
  it("Ctrl-C hibernates the demo agent to a snapshot; the next start restores it with its state", async () => {
    const dataDir = mkdtempSync(join(tmpdir(), "agentvm-startq-"));
    const run = (curl: string) => spawnSync("bash", ["-c", `${curl} -s -D -`]).stdout.toString();
    try {
      const first = await start(dataDir);
      expect(run(first.curl)).toMatch(/x-wake: boot[\s\S]*\{"count":1\}/);
      expect(await ctrlC(first.child)).toBe(0);
      expect(qemusUsing(dataDir)).toBe(0);

      const second = await start(dataDir);
      const answer = run(second.curl);
      expect(answer).toMatch(/x-wake: restore/);
      expect(answer).toContain('{"count":2}');
      expect(answer).toMatch(/server-timing: .*clockfix;dur=/);
      expect(await ctrlC(second.child)).toBe(0);
      expect(qemusUsing(dataDir)).toBe(0);
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 300_000);
});
