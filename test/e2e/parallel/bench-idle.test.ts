// `npm run bench:idle` run short through the whole system (process driver, PGlite): it ends with a RESULT line, and the
// system at rest wakes up about as often as its timers say (the event-loop delay monitor 10 times a second, a few polls
// and passes each second), not the 100+ a second it once did. Wake-ups are counted, not timed: a loaded machine runs
// the same timers late, not more often.
import { execFile } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

const root = join(import.meta.dirname, "..", "..", "..");

describe("bench:idle, short", () => {
  it("measures the system at rest beside a bare Node process, and the system's main thread sleeps between its timers", async () => {
    const { code, out, err } = await new Promise<{ code: number; out: string; err: string }>((done) =>
      execFile(
        process.execPath,
        [join(root, "scripts", "bench-idle.ts"), "--seconds", "6", "--idle-timeout-ms", "500"],
        { cwd: root, timeout: 180_000, env: { ...process.env, DATABASE_URL: "" } },
        (error, stdout, stderr) => done({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, out: stdout, err: stderr }),
      ),
    );
    expect(code, `${out}\n${err}`).toBe(0);
    const line = out.split("\n").find((l) => l.startsWith("RESULT "));
    expect(line, out).toBeDefined();
    const r = JSON.parse(line!.slice(7)) as Record<string, number | string>;
    expect(r).toMatchObject({ database: "pglite", seconds: 6 });
    for (const k of ["system_cpu_pct", "system_wakeups_per_s", "reference_cpu_pct", "reference_wakeups_per_s"]) {
      expect(typeof r[k], k).toBe("number");
      expect(r[k] as number, k).toBeGreaterThanOrEqual(0);
    }
    expect(r.system_wakeups_per_s).toBeGreaterThan(5); // the delay monitor samples 10 times a second
    expect(r.system_wakeups_per_s).toBeLessThan(30);
    expect(r.reference_wakeups_per_s).toBeLessThan(5);
  }, 200_000);
});
