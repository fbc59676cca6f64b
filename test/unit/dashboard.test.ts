// The dashboard's logic without a browser: the plots' scaling, money in integers, its routes, the files the gateway serves, and that its TSX typechecks.
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { bars, niceStep, timeTicks, valueScale } from "../../dashboard/plot.ts";
import { costMicros, formatCents, formatMicros, groupDigits } from "../../dashboard/money.ts";
import { hrefs, routeOf } from "../../dashboard/paths.ts";
import { dashboardFile } from "../../gateway/node/dashboard.ts";
import { dashboardSourceHash, ensureDashboard } from "../../scripts/build-dashboard.ts";

const hour = 3_600_000;
const utc = (t: number) => {
  const d = new Date(t);
  return { hour: d.getUTCHours(), month: d.getUTCMonth() + 1, day: d.getUTCDate() };
};

describe("the plots' value axis", () => {
  it("rounds steps up to 1, 2 or 5 × 10ⁿ", () => {
    expect([0.3, 1, 1.1, 2.5, 7, 12, 0.07, 450].map(niceStep)).toEqual([0.5, 1, 2, 5, 10, 20, 0.1, 500]);
  });

  it("puts the top at a whole number of nice steps at or above the largest value", () => {
    expect(valueScale(7)).toEqual({ top: 8, step: 2, ticks: [0, 2, 4, 6, 8] });
    expect(valueScale(100)).toEqual({ top: 100, step: 50, ticks: [0, 50, 100] });
    expect(valueScale(3600).top).toBeGreaterThanOrEqual(3600);
    expect(valueScale(0.9)).toEqual({ top: 1, step: 0.5, ticks: [0, 0.5, 1] });
    for (const max of [0.001, 0.3, 1, 9.99, 123, 86_400, 1e9]) {
      const s = valueScale(max);
      expect(s.top).toBeGreaterThanOrEqual(max);
      expect(s.top / s.step).toBeLessThanOrEqual(5); // about 4 steps, never a crowd of labels
      expect(s.ticks[0]).toBe(0);
      expect(s.ticks.at(-1)).toBeCloseTo(s.top);
    }
  });

  it("gives an empty plot the axis 0…1, and whole units steps of at least 1", () => {
    expect(valueScale(0).top).toBe(1);
    expect(valueScale(Number.NaN).top).toBe(1);
    expect(valueScale(0, 4, { integer: true })).toEqual({ top: 1, step: 1, ticks: [0, 1] });
    expect(valueScale(3, 4, { integer: true })).toEqual({ top: 3, step: 1, ticks: [0, 1, 2, 3] });
  });
});

describe("the plots' bars", () => {
  const domain = { from: 0, to: 24 * hour };
  const size = { width: 240, height: 100 };

  it("places a window by its start and length and scales its value to the height", () => {
    const [bar] = bars([{ start: 6 * hour, end: 7 * hour, value: 5 }], domain, size, 10);
    expect(bar).toMatchObject({ x: 60, width: 9, height: 50, y: 50 });
  });

  it("clips windows to the range, drops those outside, keeps a tiny window visible", () => {
    const out = bars(
      [
        { start: -2 * hour, end: hour, value: 10 },
        { start: 30 * hour, end: 31 * hour, value: 10 },
        { start: 2 * hour, end: 2 * hour + 1000, value: 20 },
      ],
      domain,
      size,
      10,
    );
    expect(out).toHaveLength(2);
    expect(out[0]).toMatchObject({ x: 0, width: 9, height: 100 });
    expect(out[1]).toMatchObject({ width: 1, height: 100 }); // a value above the top is drawn at the top
    expect(bars([{ start: 0, end: hour, value: 1 }], { from: 5, to: 5 }, size, 10)).toEqual([]);
  });
});

describe("the plots' time labels", () => {
  it("labels hours in steps that keep at most 8 labels", () => {
    const ticks = timeTicks({ from: 0, to: 24 * hour }, 240, "hour", 8, utc);
    expect(ticks.map((t) => t.label)).toEqual(["00:00", "03:00", "06:00", "09:00", "12:00", "15:00", "18:00", "21:00"]);
    expect(ticks.map((t) => t.x)).toEqual([0, 30, 60, 90, 120, 150, 180, 210]);
    expect(timeTicks({ from: 0, to: 6 * hour }, 60, "hour", 8, utc).map((t) => t.label)).toEqual(["00:00", "01:00", "02:00", "03:00", "04:00", "05:00"]);
    expect(timeTicks({ from: 30 * 60_000, to: 3 * hour }, 60, "hour", 8, utc).map((t) => t.label)).toEqual(["01:00", "02:00"]);
  });

  it("labels days at local midnights", () => {
    const from = Date.UTC(2026, 6, 1);
    const ticks = timeTicks({ from, to: Date.UTC(2026, 7, 1) }, 310, "day", 8, utc);
    // 31 midnights: every 5th keeps it to 7 labels
    expect(ticks.map((t) => t.label)).toEqual(["07-01", "07-06", "07-11", "07-16", "07-21", "07-26", "07-31"]);
    // a zone an hour ahead cuts its days an hour earlier in UTC
    const ahead = timeTicks({ from, to: from + 3 * 24 * hour }, 300, "day", 8, (t) => utc(t + hour));
    expect(ahead.map((t) => t.label)).toEqual(["07-02", "07-03", "07-04"]);
    expect(ahead[0]!.x).toBeCloseTo((23 / 72) * 300);
  });
});

describe("money on the page", () => {
  const rates = { vcpuSecondNanocents: 1_000_000, gibSecondNanocents: 100_000 };

  it("prices usage in integer micro-units, like an invoice line before its rounding to the cent", () => {
    // one vCPU-hour at 10⁶ nano-cents a vCPU-second: 3.6 cents = 36,000 micro-dollars (the default card's $0.036)
    expect(costMicros({ vcpuMs: hour, mibMs: 0 }, rates)).toBe(36_000n);
    // one GiB-hour at 10⁵ nano-cents a GiB-second: $0.0036
    expect(costMicros({ vcpuMs: 0, mibMs: 1024 * hour }, rates)).toBe(3_600n);
    // 1 s of 1 vCPU with 256 MiB: 10 + 0.25 micro, rounded half up
    expect(costMicros({ vcpuMs: 1000, mibMs: 256_000 }, rates)).toBe(10n);
    expect(costMicros({ vcpuMs: 50, mibMs: 0 }, rates)).toBe(1n); // exactly 0.5 micro rounds up
    // beyond 2^53 nano-cent products the arithmetic stays exact
    expect(costMicros({ vcpuMs: 9e15, mibMs: 0 }, { vcpuSecondNanocents: 1_000_000_000, gibSecondNanocents: 0 })).toBe(90_000_000_000_000_000n);
  });

  it("adds dozing memory at the card's doze price, or at its snapshot rate when that is null, as the invoice does", () => {
    // 1 GiB dozing for an hour at 10⁵ nano-cents a GiB-second: $0.0036 = 3,600 micro, on top of the active usage
    const dozing = { vcpuMs: hour, mibMs: 0, dozedMibMs: 1024 * hour };
    expect(costMicros(dozing, { ...rates, snapshotGibMonthNanocents: 0, dozeGibSecondNanocents: 100_000 })).toBe(36_000n + 3_600n);
    // null: the snapshot rate, $0.10 a GiB-month of 730 h → one GiB-hour is 0.1 / 730 dollars = 136.986… → 137 micro
    expect(costMicros(dozing, { ...rates, snapshotGibMonthNanocents: 10_000_000_000, dozeGibSecondNanocents: null })).toBe(36_000n + 137n);
    // dozing vCPUs at the card's doze vCPU price: 2 vCPUs dozing an hour at 10⁵ nano-cents a vCPU-second = 7,200 micro
    expect(costMicros({ ...dozing, dozedVcpuMs: 2 * hour }, { ...rates, dozeVcpuSecondNanocents: 100_000, dozeGibSecondNanocents: 0 })).toBe(36_000n + 7_200n);
    expect(costMicros({ ...dozing, dozedVcpuMs: 2 * hour }, { ...rates, dozeGibSecondNanocents: 0 })).toBe(36_000n); // no doze vCPU price: free
    // a usage row or card without doze fields (older answers) costs what it did
    expect(costMicros({ vcpuMs: hour, mibMs: 0 }, { ...rates, dozeGibSecondNanocents: null })).toBe(36_000n);
  });

  it("writes micro-units and cents without floats", () => {
    expect(formatMicros(0n)).toBe("0.00");
    expect(formatMicros(10n)).toBe("0.00001");
    expect(formatMicros(500_000n)).toBe("0.50");
    expect(formatMicros(1_234_567n)).toBe("1.234567");
    expect(formatCents(0)).toBe("0.00");
    expect(formatCents(12345)).toBe("123.45");
    expect(formatCents(-5)).toBe("-0.05");
    expect(formatCents(900719925474099312n)).toBe("9007199254740993.12");
    expect(groupDigits("1234567")).toBe("1,234,567");
    expect(groupDigits("12")).toBe("12");
  });
});

describe("the dashboard's routes", () => {
  it("maps paths under /dashboard/ to pages and back", () => {
    expect(routeOf("/dashboard/")).toEqual({ page: "agents" });
    expect(routeOf("/dashboard")).toEqual({ page: "agents" });
    expect(routeOf("/dashboard/signin")).toEqual({ page: "signin" });
    expect(routeOf("/dashboard/usage")).toEqual({ page: "usage" });
    expect(routeOf(hrefs.pools())).toEqual({ page: "pools" });
    expect(routeOf(hrefs.agent("agt a/b"))).toEqual({ page: "agent", id: "agt a/b" });
    expect(routeOf("/dashboard/agents/x/y")).toEqual({ page: "missing", path: "/dashboard/agents/x/y" });
    expect(routeOf("/dashboard/agents/%E0%A4%A")).toMatchObject({ page: "missing" });
    // The desktop viewer, at the API's path and under /dashboard/
    expect(routeOf(hrefs.desktop("agt_x"))).toEqual({ page: "desktop", id: "agt_x" });
    expect(hrefs.desktop("agt_x")).toBe("/v1/agents/agt_x/desktop");
    expect(routeOf("/dashboard/agents/agt_x/desktop")).toEqual({ page: "desktop", id: "agt_x" });
    expect(routeOf("/v1/agents/agt_x/desktop/vnc")).toMatchObject({ page: "missing" });
    expect(routeOf("/v1/agents/%E0%A4%A/desktop")).toMatchObject({ page: "missing" });
    // Sign-in comes back to a known page only
    expect(hrefs.signin("/v1/agents/agt_x/desktop")).toBe("/dashboard/signin?next=%2Fv1%2Fagents%2Fagt_x%2Fdesktop");
    expect(hrefs.signin("/dashboard/usage")).toBe("/dashboard/signin?next=%2Fdashboard%2Fusage");
    for (const elsewhere of ["/v1/agents", "/agents", "//evil.example/dashboard/", "/dashboard/signin", "/dashboard/"])
      expect(hrefs.signin(elsewhere)).toBe("/dashboard/signin");
  });

  it("serves only files inside the build, none hidden", () => {
    const dir = "/srv/dist/dashboard";
    expect(dashboardFile(dir, "app-ABC123.js")).toBe(join(dir, "app-ABC123.js"));
    for (const bad of ["../package.json", "%2e%2e/package.json", "..%2fpackage.json", ".build-stamp.json", "x/.hidden", "a%00b", "%E0%A4%A"])
      expect(dashboardFile(dir, bad), bad).toBeUndefined();
  });
});

describe("the dashboard's sources", () => {
  it("build into one script, one stylesheet, the viewer's noVNC chunk and the index.html naming the first two, and only once while unchanged", async () => {
    const out = join(mkdtempSync(join(tmpdir(), "agentvm-dashboard-build-")), "dashboard");
    try {
      const lines: string[] = [];
      expect(await ensureDashboard({ outDir: out, log: (l) => lines.push(l) })).toBe(out);
      const files = readdirSync(out).sort();
      expect(files).toEqual([
        ".build-stamp.json",
        expect.stringMatching(/^app-[A-Z0-9]+\.js$/),
        expect.stringMatching(/^chunk-[A-Z0-9]+\.js$/),
        "index.html",
        expect.stringMatching(/^style-[A-Z0-9]+\.css$/),
      ]);
      const html = readFileSync(join(out, "index.html"), "utf8");
      for (const f of files.filter((f) => /^(app|style)-.*\.(js|css)$/.test(f))) expect(html).toContain(`/dashboard/${f}`);
      // noVNC is in the chunk the viewer imports, not in the script every page loads
      const chunk = files.find((f) => f.startsWith("chunk-"))!;
      expect(readFileSync(join(out, chunk), "utf8")).toContain("RFB");
      expect(readFileSync(join(out, files[1]!), "utf8")).toContain(chunk);
      expect(statSync(join(out, files[1]!)).size).toBeLessThan(80_000);
      expect(html).not.toMatch(/https?:\/\//); // nothing from a CDN
      expect(JSON.parse(readFileSync(join(out, ".build-stamp.json"), "utf8")).hash).toBe(dashboardSourceHash());
      const built = statSync(join(out, "index.html")).mtimeMs;
      expect(lines).toHaveLength(1);

      await ensureDashboard({ outDir: out, log: (l) => lines.push(l) });
      expect(lines).toHaveLength(1); // the stamp matched: nothing rebuilt
      expect(statSync(join(out, "index.html")).mtimeMs).toBe(built);

      rmSync(join(out, files[1]!)); // a bundle file gone: the stamp no longer vouches for the directory
      await ensureDashboard({ outDir: out, log: (l) => lines.push(l) });
      expect(lines).toHaveLength(2);
      expect(readdirSync(out).sort()).toEqual(files);
    } finally {
      rmSync(join(out, ".."), { recursive: true, force: true });
    }
  });

  it("typecheck (esbuild bundles without checking)", () => {
    const tsc = join(dirname(createRequire(import.meta.url).resolve("typescript/package.json")), "bin", "tsc");
    const r = spawnSync(process.execPath, [tsc, "--noEmit", "-p", join(import.meta.dirname, "..", "..", "dashboard", "tsconfig.json")], { encoding: "utf8" });
    expect(r.stdout + r.stderr).toBe("");
    expect(r.status).toBe(0);
  });
});
