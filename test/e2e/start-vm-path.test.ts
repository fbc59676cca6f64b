// `npm start` with DRIVER unset provisions the VM path itself (the guest image here, QEMU too as root on Debian) and runs
// QEMU, saying each step and the time it took; DRIVER=process skips all of it.
import { describe, expect, it } from "vitest";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const qemuPresent = spawnSync("sh", ["-c", "command -v qemu-system-x86_64"]).status === 0;
if (!qemuPresent && process.env.CI === "true") throw new Error("CI: qemu-system-x86_64 missing (npm test provisions it: scripts/provision.ts)");

/** Runs `scripts/start.ts` with `driver` in a fresh data directory until its banner, then SIGTERM; what it printed and its exit code. */
async function startAndStop(driver: string): Promise<{ out: string; code: number | null }> {
  const dataDir = mkdtempSync(join(tmpdir(), "agentvm-vmpath-"));
  const child = spawn(process.execPath, ["scripts/start.ts"], {
    env: { ...process.env, DATA_DIR: dataDir, PORT: "0", DRIVER: driver, LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  try {
    const deadline = Date.now() + 120_000;
    while (!out.includes("Stop with Ctrl-C")) {
      if (child.exitCode !== null) throw new Error(`start exited early: ${out}`);
      if (Date.now() > deadline) throw new Error(`no banner in 120 s: ${out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const exited = new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
    child.kill("SIGTERM");
    return { out, code: await exited };
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
    rmSync(dataDir, { recursive: true, force: true });
  }
}

describe("npm start's VM path", () => {
  it(qemuPresent
    ? "DRIVER unset, QEMU installed: the guest image is built with progress lines and the time taken, and the agents run on qemu"
    : "DRIVER unset, no QEMU here: one line says why agents run as processes and what to run", async () => {
    const { out, code } = await startAndStop("");
    expect(code, out).toBe(0);
    if (qemuPresent) {
      expect(out).toMatch(/^vm path: guest image: building [0-9a-f]{12} /m);
      expect(out).toMatch(/^vm path: guest image: built in \d+\.\d s/m);
      expect(out).toMatch(/^VM path ready in \d+\.\d s$/m);
      expect(out).toContain("agentvm is running (driver: qemu;");
      expect(out).not.toContain("NOT isolated");
      expect(out.indexOf("VM path ready")).toBeLessThan(out.indexOf("agentvm is running"));
    } else {
      const lines = out.split("\n").filter((l) => l.startsWith("driver: process"));
      expect(lines, out).toHaveLength(1);
      expect(lines[0]).toMatch(/NOT isolated\): .*; for real VMs .*, then npm start again$/);
      expect(out).toContain("agentvm is running (driver: process, NOT isolated;");
    }
  }, 180_000);

  it("DRIVER=process skips all of it: no VM path step, the process driver", async () => {
    const { out, code } = await startAndStop("process");
    expect(code, out).toBe(0);
    expect(out).not.toMatch(/vm path/i);
    expect(out).toContain("agentvm is running (driver: process, NOT isolated;");
  }, 120_000);
});
