// `npm run bench:scale` run small through the whole system on real QEMU (200 agents registered, 12 asleep, 2 awake):
// it ends with a RESULT line whose figures are there and sane, and leaves no QEMU or data dir behind.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { qemuPids } from "../../scripts/bench/scale/host-process.ts";
import { testAccel } from "../helpers/qemu.ts";

const root = join(import.meta.dirname, "..", "..");

function runBench(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      [join(root, "scripts", "bench-scale.ts"), ...args],
      { cwd: root, timeout: 240_000, maxBuffer: 16 * 2 ** 20 },
      (error, out, err) => done({ code: error ? ((error as { code?: number }).code ?? 1) : 0, out, err }),
    );
  });
}

describe("bench:scale, small", () => {
  it("registers, hibernates, wakes and pages through the system, and reports every figure", async () => {
    const dataDir = resolve(process.env.DATA_DIR ?? join(root, ".data"));
    const { code, out, err } = await runBench([
      ...["--registered", "200", "--hibernated", "12", "--awake", "2", "--wake-samples", "5", "--quiet-s", "5"],
      ...["--accel", testAccel(), "--data-dir", dataDir],
    ]);
    expect(code, `${out}\n${err}`).toBe(0);
    const line = out.split("\n").find((l) => l.startsWith("RESULT "));
    expect(line, out).toBeDefined();
    const r = JSON.parse(line!.slice(7)) as Record<string, unknown>;
    expect(r.registered_agents).toBe(200);
    expect(r.hibernated_agents).toBe(12);
    for (const key of ["rss_kb_per_hibernated_agent", "fds_per_hibernated_agent", "wake_p99_ratio", "reaper_cpu_pct", "load1", "available_mib"])
      expect(Number.isFinite(r[key]), key).toBe(true);
    // Positive and within what a machine can hold: a sleeping clone of 128 MiB keeps some MiB of RAM file, a wake
    // answers in under a minute, a page of 100 agents comes in under 10 s.
    for (const key of [
      "disk_mib_per_hibernated_agent",
      "wake_p50_ms_among_n",
      "wake_p99_ms_among_n",
      "wake_p99_ms_among_10",
      "api_page_p50_ms",
      "api_page_p99_ms",
    ]) {
      const v = r[key] as number;
      expect(v > 0, `${key} = ${v}`).toBe(true);
    }
    expect(r.disk_mib_per_hibernated_agent as number).toBeLessThan(128);
    expect(r.wake_p99_ms_among_n as number).toBeLessThan(60_000);
    expect(r.api_page_p99_ms as number).toBeLessThan(10_000);
    expect(r.api_pages).toBe(3);
    // Tier for tier: only tiers with 5 wakes at both sizes, each a positive ratio.
    const byTier = r.wake_p99_ratio_by_tier as Record<string, number>;
    expect(typeof byTier).toBe("object");
    for (const [tier, v] of Object.entries(byTier)) expect(v > 0 && Number.isFinite(v), `${tier} = ${v}`).toBe(true);
    expect((r.trickle as { failed: number }).failed).toBe(0);
    expect(r.fs).toBe("ext4");
    expect(typeof r.fs_is).toBe("string");
    const tmp = out.match(/data dir (\S+) on/)?.[1];
    expect(tmp, out).toBeDefined();
    expect(existsSync(tmp!), "the data dir is removed").toBe(false);
    expect(qemuPids(tmp!)).toEqual([]);
  }, 300_000);
});
