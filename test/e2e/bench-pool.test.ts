// `npm run bench:pool` run small through the whole system on real QEMU (a pool of 2, a few rounds each): it ends with a
// RESULT line whose figures are there and sane, every baseline measured.
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { testAccel } from "../helpers/qemu.ts";

const root = join(import.meta.dirname, "..", "..");

interface Spread {
  n: number;
  p50: number;
  p99: number;
}

describe("bench:pool, small", () => {
  it("measures exec, a hibernated exec, resets, forks, a pool's acquire and release, and the baselines", async () => {
    const dataDir = resolve(process.env.DATA_DIR ?? join(root, ".data"));
    const baseline = existsSync("/bin/busybox") && process.getuid?.() === 0 ? "host,process" : "host";
    const { code, out, err } = await new Promise<{ code: number; out: string; err: string }>((done) =>
      execFile(
        process.execPath,
        [
          join(root, "scripts", "bench-pool.ts"),
          ...["--warm", "5", "--hibernated", "2", "--resets", "2", "--pool", "2", "--forks", "2", "--concurrency", "2"],
          ...["--baseline", baseline, "--accel", testAccel(), "--data-dir", dataDir],
        ],
        { cwd: root, timeout: 480_000, maxBuffer: 16 * 2 ** 20 },
        (error, stdout, stderr) => done({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, out: stdout, err: stderr }),
      ),
    );
    expect(code, `${out}\n${err}`).toBe(0);
    const line = out.split("\n").find((l) => l.startsWith("RESULT "));
    expect(line, out).toBeDefined();
    const r = JSON.parse(line!.slice(7)) as Record<string, unknown> & {
      baseline: Record<string, Spread>;
      reset: Record<string, Spread>;
      acquire: Record<string, Spread>;
      forks: { perSecond: number };
      poolFill: { forksPerSecond: number };
      met: Record<string, boolean>;
    };
    const spreads: [string, Spread | undefined, number][] = [
      ["warmExec", r.warmExec as Spread, 5],
      ["hibernatedExecFirstByte", r.hibernatedExecFirstByte as Spread, 2],
      ["reset.toNextOutput", r.reset.toNextOutput, 2],
      ["acquire.call", r.acquire.call, 2],
      ["baseline.hostExecFile", r.baseline.hostExecFile, 5],
      ["baseline.proxiedCall", r.baseline.proxiedCall, 5],
      ...(baseline.includes("process") ? [["baseline.processDriverExec", r.baseline.processDriverExec, 5] as [string, Spread | undefined, number]] : []),
    ];
    for (const [name, s, n] of spreads) {
      expect(s?.n, name).toBe(n);
      expect(s!.p50 > 0 && s!.p50 <= s!.p99 && s!.p99 < 60_000, `${name}: ${JSON.stringify(s)}`).toBe(true);
    }
    expect(r.forks.perSecond).toBeGreaterThan(0);
    expect(r.poolFill.forksPerSecond).toBeGreaterThan(0);
    expect(Object.keys(r.met).sort()).toEqual(["acquire", "reset", "warmExec"]);
  }, 500_000);
});
