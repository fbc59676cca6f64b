// The report's fast path: query lines read into ordered columns, and the JSON written from them byte for byte as JSON.stringify would.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { usageJson, usageJsonBytes } from "../../billing/report-views.ts";
import { columnsOf, compareCodePoints, type UsageColumns, type UsageTable } from "../../billing/usage.ts";
import { monthRange, windowBoundaries } from "../../billing/zones.ts";

const bytesOrder = (a: string, b: string) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
const sign = (n: number) => Math.sign(n);

/** What `asLines` makes Postgres write for one grouped row without agents. */
const line = (w: number, a: number, v: number, m: number) => `${w},${a},${v},${m}`;

/** What `asLines` makes Postgres write for one agent's rows (`[w, active, vcpu, mib]` each) when grouped by agent. */
const agentLine = (agent: string, rows: readonly (readonly [number, number, number, number])[]) =>
  `${rows.map((r) => r.join(",")).join(";")},${JSON.stringify(agent)}`;

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
    const sums = (k: number) => [k + 1, 2 * (k + 1), 2 ** 40 + k] as const;
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
      expect([c.activeMs[i], c.vcpuMs[i], c.mibMs[i]]).toEqual(sums(k));
    }
  });

  it("reads any agents' lines as the rows they hold, in (window, agent) order", () => {
    const row = fc.tuple(fc.nat({ max: 40 }), fc.maxSafeNat(), fc.maxSafeNat(), fc.maxSafeNat());
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.tuple(fc.string({ unit: "grapheme", minLength: 1 }), fc.uniqueArray(row, { minLength: 1, maxLength: 6, selector: (r) => r[0] })), {
          maxLength: 8,
          selector: ([id]) => id,
        }),
        (agents) => {
          const c = columnsOf(agents.map(([id, rs]) => agentLine(id, rs)).join("\n"), true);
          const want = agents.flatMap(([id, rs]) => rs.map((r) => [r[0], id, r[1], r[2], r[3]] as const)).sort((x, y) => x[0] - y[0] || bytesOrder(x[1], y[1]));
          expect(Array.from({ length: c.length }, (_, i) => [c.window[i], c.agents![c.agent![i]!], c.activeMs[i], c.vcpuMs[i], c.mibMs[i]])).toEqual(want);
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
    const c = columnsOf([line(2, 5, 6, 7), line(0, -3, 0, Number.MAX_SAFE_INTEGER), line(1, 1, 1, 1)].join("\n"), false);
    expect(c.agents).toBeUndefined();
    expect(Array.from(c.window)).toEqual([0, 1, 2]);
    expect(Array.from(c.activeMs)).toEqual([-3, 1, 5]);
    expect(c.mibMs[0]).toBe(Number.MAX_SAFE_INTEGER);
    expect(columnsOf([line(2, 5, 6, 7), null, [line(0, -3, 0, Number.MAX_SAFE_INTEGER), line(1, 1, 1, 1)].join("\n")], false)).toEqual(c);
    expect(columnsOf(null, true).length).toBe(0);
    expect(columnsOf([], true).length).toBe(0);
    expect(columnsOf("", false).length).toBe(0);
  });

  it("refuses sums of 2^53 or more, as toNumber does, and lines it cannot read", () => {
    expect(() => columnsOf(line(0, 2 ** 53, 1, 1), false)).toThrow(/exceeds 2\^53/);
    expect(() => columnsOf("0,1,2", false)).toThrow(/unreadable/);
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
    expect(() => columnsOf('0,1,2,3,"agt_a', true)).toThrow(/unreadable/);
    expect(() => columnsOf('"agt_a"', true)).toThrow(/unreadable/);
    expect(columnsOf('0,1,2,3;1,4,5,6,"agt_a"', true).length).toBe(2);
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
    const row = fc.record({ w: fc.integer({ min: 0, max: 30 }), agent: fc.integer({ min: 0, max: 5 }), a: sum, v: sum, m: sum });
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
    const empty: UsageColumns = {
      length: 0,
      window: new Int32Array(0),
      activeMs: new Float64Array(0),
      vcpuMs: new Float64Array(0),
      mibMs: new Float64Array(0),
    };
    const t = table(empty, "Asia/Kolkata", "agt_1");
    const text = decode(usageJsonBytes(t, ["day"]));
    expect(text).toBe(JSON.stringify(usageJson(t, ["day"])));
    expect(Object.keys(JSON.parse(text))).toEqual(["tenantId", "from", "to", "timeZone", "groupBy", "agentId", "source", "rows", "totals"]);
    expect(JSON.parse(text).from).toBe("2026-03-01T00:00:00+05:30");
  });
});
