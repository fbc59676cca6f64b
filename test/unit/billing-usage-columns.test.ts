// The report's fast path: query lines read into ordered columns, and the JSON written from them byte for byte as JSON.stringify would.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { usageJson, usageJsonBytes } from "../../billing/report-views.ts";
import { columnsOf, compareCodePoints, type UsageColumns, type UsageTable } from "../../billing/usage.ts";
import { emptyColumns, withHibernated } from "../../billing/usage-columns.ts";
import { monthRange, windowBoundaries } from "../../billing/zones.ts";

const bytesOrder = (a: string, b: string) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
const sign = (n: number) => Math.sign(n);

/** What `asLines` makes Postgres write for one grouped row without agents (dozed sums 0 unless given). */
const line = (w: number, a: number, v: number, m: number, d = 0, dv = 0, dm = 0) => `${w},${a},${v},${m},${d},${dv},${dm}`;

/**
 * What `asLines` makes Postgres write for one agent's rows (`[w, active, vcpu, mib, dozed, dozedVcpu, dozedMib]` each,
 * the dozed sums 0 when left out) when grouped by agent.
 */
const agentLine = (agent: string, rows: readonly (readonly number[])[]) =>
  `${rows.map((r) => [...r, 0, 0, 0].slice(0, 7).join(",")).join(";")},${JSON.stringify(agent)}`;

/** Agent ids that sort differently in UTF-16 and in code points, and that need escapes in JSON. */
const awkwardIds = [
  "agt_b",
  "agt_B",
  "agt_a",
  "agt_a.",
  "\u{1F600}",
  "\uFFFD",
  "\uE000",
  "é",
  'q"uote',
  "back\\slash",
  "new\nline",
  "tab\t",
  "\u0001",
  "semi;colon",
  "com,ma",
  '";',
];

function table(columns: UsageColumns, zone = "America/New_York", agentId?: string): UsageTable {
  const { start, end } = monthRange(zone, "2026-03");
  const boundaries = windowBoundaries(zone, start, end, "day");
  return {
    query: { tenantId: "ten_x", from: start, to: end, zone, byAgent: columns.agents !== undefined, time: "day", ...(agentId ? { agentId } : {}) },
    source: "rollup",
    boundaries,
    columns,
    totals: {
      activeMs: columns.activeMs.reduce((t, x) => t + x, 0),
      vcpuMs: columns.vcpuMs.reduce((t, x) => t + x, 0),
      mibMs: columns.mibMs.reduce((t, x) => t + x, 0),
      dozedMs: columns.dozedMs.reduce((t, x) => t + x, 0),
      dozedVcpuMs: columns.dozedVcpuMs.reduce((t, x) => t + x, 0),
      dozedMibMs: columns.dozedMibMs.reduce((t, x) => t + x, 0),
      hibernatedMs: columns.hibernatedMs.reduce((t, x) => t + x, 0),
    },
  };
}

describe("compareCodePoints", () => {
  it("orders strings as Postgres's C collation does (UTF-8 bytes), also past U+FFFF where UTF-16 order differs", () => {
    expect("\u{1F600}" < "\uFFFD").toBe(true); // UTF-16 puts the surrogate first…
    expect(compareCodePoints("\u{1F600}", "\uFFFD")).toBeGreaterThan(0); // …code points do not
    fc.assert(
      fc.property(fc.string({ unit: "grapheme" }), fc.string({ unit: "grapheme" }), (a, b) => {
        expect(sign(compareCodePoints(a, b))).toBe(sign(bytesOrder(a, b)));
      }),
      { numRuns: 2000 },
    );
  });
});

describe("columnsOf", () => {
  it("puts unordered lines in (window, agent) order, agents in C order, and unescapes JSON-quoted ids", () => {
    const rows: [number, string][] = [];
    for (let w = 0; w < 4; w++) for (const id of awkwardIds) rows.push([w, id]);
    // a deterministic shuffle, as a hash aggregate answers; each row's sums name its place in the shuffle
    const shuffled = rows
      .map((r, i) => ({ r, k: (i * 7919) % rows.length }))
      .sort((x, y) => x.k - y.k)
      .map((x) => x.r);
    const sums = (k: number) => [k + 1, 2 * (k + 1), 2 ** 40 + k, 3 * k, 5 * k + 2, 2 ** 41 + k] as const;
    // an agent's rows in the order they were shuffled to; every other agent's rows in two lines (a report in parts)
    const lines: string[] = [];
    awkwardIds.forEach((id, a) => {
      const mine = shuffled.flatMap(([w, rid], k) => (rid === id ? [[w, ...sums(k)] as const] : []));
      if (a % 2 === 0) lines.push(agentLine(id, mine));
      else lines.push(agentLine(id, mine.slice(0, 1)), agentLine(id, mine.slice(1)));
    });
    const text = lines
      .map((l, i) => ({ l, k: (i * 31) % lines.length }))
      .sort((x, y) => x.k - y.k)
      .map((x) => x.l)
      .join("\n");
    const c = columnsOf(text, true);
    expect(c.length).toBe(rows.length);
    expect(c.agents).toEqual([...awkwardIds].sort(bytesOrder));
    const got = Array.from({ length: c.length }, (_, i) => [c.window[i], c.agents![c.agent![i]!]]);
    const want = [...rows].sort((x, y) => x[0] - y[0] || bytesOrder(x[1], y[1]));
    expect(got).toEqual(want);
    // each row keeps its own sums
    for (let i = 0; i < c.length; i++) {
      const k = shuffled.findIndex(([w, id]) => w === c.window[i] && id === c.agents![c.agent![i]!]);
      expect([c.activeMs[i], c.vcpuMs[i], c.mibMs[i], c.dozedMs[i], c.dozedVcpuMs[i], c.dozedMibMs[i]]).toEqual(sums(k));
    }
  });

  it("reads any agents' lines as the rows they hold, in (window, agent) order", () => {
    const row = fc.tuple(fc.nat({ max: 40 }), fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat());
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.tuple(fc.string({ unit: "grapheme", minLength: 1 }), fc.uniqueArray(row, { minLength: 1, maxLength: 6, selector: (r) => r[0] })), {
          maxLength: 8,
          selector: ([id]) => id,
        }),
        (agents) => {
          const c = columnsOf(agents.map(([id, rs]) => agentLine(id, rs)).join("\n"), true);
          const want = agents
            .flatMap(([id, rs]) => rs.map((r) => [r[0], id, r[1], r[2], r[3], r[4], r[5], r[6]] as const))
            .sort((x, y) => x[0] - y[0] || bytesOrder(x[1], y[1]));
          expect(
            Array.from({ length: c.length }, (_, i) => [
              c.window[i],
              c.agents![c.agent![i]!],
              c.activeMs[i],
              c.vcpuMs[i],
              c.mibMs[i],
              c.dozedMs[i],
              c.dozedVcpuMs[i],
              c.dozedMibMs[i],
            ]),
          ).toEqual(want);
          expect(c.agents).toEqual(agents.map(([id]) => id).sort(bytesOrder));
          // the same lines as two texts (a report in parts), empty ones and nulls among them
          const lines = agents.map(([id, rs]) => agentLine(id, rs));
          const half = lines.length >> 1;
          expect(columnsOf([lines.slice(0, half).join("\n"), null, "", lines.slice(half).join("\n")], true)).toEqual(c);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("reads rows without agents, no rows at all, negative numbers and the largest exact integer", () => {
    const c = columnsOf([line(2, 5, 6, 7, 8, 10, 9), line(0, -3, 0, Number.MAX_SAFE_INTEGER), line(1, 1, 1, 1)].join("\n"), false);
    expect(c.agents).toBeUndefined();
    expect(Array.from(c.window)).toEqual([0, 1, 2]);
    expect(Array.from(c.activeMs)).toEqual([-3, 1, 5]);
    expect(c.mibMs[0]).toBe(Number.MAX_SAFE_INTEGER);
    expect([c.dozedMs[2], c.dozedVcpuMs[2], c.dozedMibMs[2], c.hibernatedMs[2]]).toEqual([8, 10, 9, 0]);
    expect(columnsOf([line(2, 5, 6, 7, 8, 10, 9), null, [line(0, -3, 0, Number.MAX_SAFE_INTEGER), line(1, 1, 1, 1)].join("\n")], false)).toEqual(c);
    expect(columnsOf(null, true).length).toBe(0);
    expect(columnsOf([], true).length).toBe(0);
    expect(columnsOf("", false).length).toBe(0);
  });

  it("refuses sums of 2^53 or more, as toNumber does, and lines it cannot read", () => {
    expect(() => columnsOf(line(0, 2 ** 53, 1, 1), false)).toThrow(/exceeds 2\^53/);
    expect(() => columnsOf("0,1,2", false)).toThrow(/unreadable/);
    expect(() => columnsOf("0,1,2,3", false)).toThrow(/unreadable/); // the four fields of a line before dozing existed
    expect(() => columnsOf("0,1,2,3,4,5", false)).toThrow(/unreadable/); // the six fields of a line before dozed vCPU-ms
    expect(() => columnsOf("0,1,x,3", false)).toThrow(/unreadable/);
    expect(() => columnsOf(line(-1, 1, 1, 1), false)).toThrow(/window/);
    expect(() => columnsOf(`${line(0, 1, 1, 1)}x`, false)).toThrow(/unreadable/);
    expect(() => columnsOf(`${line(0, 1, 1, 1)},"agt_a"`, false)).toThrow(/unreadable/);
    // by agent: rows end in ";" or "," and the quoted id, which must be there
    expect(() => columnsOf(agentLine("agt_a", [[0, 2 ** 53, 1, 1]]), true)).toThrow(/exceeds 2\^53/);
    expect(() => columnsOf("0,1,2,3", true)).toThrow(/unreadable/);
    expect(() => columnsOf('0,1,2,"agt_a"', true)).toThrow(/unreadable/);
    expect(() => columnsOf('0,1,2,3;"agt_a"', true)).toThrow(/unreadable/);
    expect(() => columnsOf('0,1,2,3,4,"agt_a"', true)).toThrow(/unreadable/);
    expect(() => columnsOf('0,1,2,3,4,5,"agt_a"', true)).toThrow(/unreadable/);
    expect(() => columnsOf('0,1,2,3,4,5,6,7,"agt_a"', true)).toThrow(/unreadable/);
    expect(() => columnsOf('0,1,2,3,"agt_a', true)).toThrow(/unreadable/);
    expect(() => columnsOf('"agt_a"', true)).toThrow(/unreadable/);
    expect(columnsOf('0,1,2,3,0,0,0;1,4,5,6,7,9,8,"agt_a"', true).length).toBe(2);
  });
});

describe("usageJsonBytes", () => {
  const decode = (b: Uint8Array) => new TextDecoder().decode(b);

  it("writes exactly what JSON.stringify(usageJson(…)) writes, for any ids and integers below 2^53", () => {
    const sum = fc.oneof(
      fc.integer({ min: 0, max: 1e9 }),
      fc.constantFrom(0, 9, 10, 99_999_999, 1e8, 1e8 + 1, 2 ** 31, 2 ** 32 + 7, 1e15, Number.MAX_SAFE_INTEGER),
      fc.maxSafeNat(),
      fc.integer({ min: -1e12, max: -1 }),
    );
    const row = fc.record({
      w: fc.integer({ min: 0, max: 30 }),
      agent: fc.integer({ min: 0, max: 5 }),
      a: sum,
      v: sum,
      m: sum,
      d: sum,
      dv: sum,
      dm: sum,
      h: sum,
    });
    fc.assert(
      fc.property(
        fc.array(row, { maxLength: 60 }),
        fc.array(fc.oneof(fc.constantFrom(...awkwardIds), fc.string({ unit: "grapheme", minLength: 1 })), { minLength: 6, maxLength: 6 }),
        fc.boolean(),
        (rows, ids, byAgent) => {
          const c: UsageColumns = {
            length: rows.length,
            window: Int32Array.from(rows, (r) => r.w),
            activeMs: Float64Array.from(rows, (r) => r.a),
            vcpuMs: Float64Array.from(rows, (r) => r.v),
            mibMs: Float64Array.from(rows, (r) => r.m),
            dozedMs: Float64Array.from(rows, (r) => r.d),
            dozedVcpuMs: Float64Array.from(rows, (r) => r.dv),
            dozedMibMs: Float64Array.from(rows, (r) => r.dm),
            hibernatedMs: Float64Array.from(rows, (r) => r.h),
          };
          if (byAgent) {
            c.agents = ids;
            c.agent = Int32Array.from(rows, (r) => r.agent);
          }
          const t = table(c);
          expect(decode(usageJsonBytes(t, byAgent ? ["agent", "day"] : ["day"]))).toBe(JSON.stringify(usageJson(t, byAgent ? ["agent", "day"] : ["day"])));
        },
      ),
      { numRuns: 300 },
    );
  });

  it("keeps the optional agentId of the query and the head's field order, for an empty answer too", () => {
    const empty = emptyColumns(0);
    const t = table(empty, "Asia/Kolkata", "agt_1");
    const text = decode(usageJsonBytes(t, ["day"]));
    expect(text).toBe(JSON.stringify(usageJson(t, ["day"])));
    expect(Object.keys(JSON.parse(text))).toEqual(["tenantId", "from", "to", "timeZone", "groupBy", "agentId", "source", "rows", "totals"]);
    expect(JSON.parse(text).from).toBe("2026-03-01T00:00:00+05:30");
  });
});

describe("withHibernated", () => {
  it("adds hibernated time to the row of its window and agent, or as a row of its own in (window, agent) order", () => {
    const c = columnsOf(
      [
        agentLine("agt_b", [
          [0, 10, 20, 30, 4, 6, 5],
          [2, 1, 1, 1],
        ]),
        agentLine("agt_a", [[1, 7, 7, 7]]),
      ].join("\n"),
      true,
    );
    const out = withHibernated(c, [
      { window: 0, agentId: "agt_b", ms: 100 },
      { window: 0, agentId: "agt_c", ms: 50 }, // slept all window: no metered row
      { window: 2, agentId: "agt_a", ms: 9 },
      { window: 0, agentId: "agt_b", ms: 1 },
    ]);
    expect(out.agents).toEqual(["agt_a", "agt_b", "agt_c"]);
    const rows = Array.from({ length: out.length }, (_, i) => [
      out.window[i],
      out.agents![out.agent![i]!],
      out.activeMs[i],
      out.dozedMs[i],
      out.dozedVcpuMs[i],
      out.dozedMibMs[i],
      out.hibernatedMs[i],
    ]);
    expect(rows).toEqual([
      [0, "agt_b", 10, 4, 6, 5, 101],
      [0, "agt_c", 0, 0, 0, 0, 50],
      [1, "agt_a", 7, 0, 0, 0, 0],
      [2, "agt_a", 0, 0, 0, 0, 9],
      [2, "agt_b", 1, 0, 0, 0, 0],
    ]);
    expect(withHibernated(c, [])).toBe(c);
  });

  it("sums every agent's hibernation into the window's row when the report is not by agent", () => {
    const c = columnsOf(line(1, 5, 5, 5), false);
    const out = withHibernated(c, [
      { window: 1, ms: 3 },
      { window: 1, ms: 4 },
      { window: 0, ms: 2 },
    ]);
    expect(out.agents).toBeUndefined();
    expect(Array.from(out.window)).toEqual([0, 1]);
    expect(Array.from(out.hibernatedMs)).toEqual([2, 7]);
    expect(Array.from(out.activeMs)).toEqual([0, 5]);
  });
});
