// A report's grouped sums as Postgres writes them (one text value of lines) and as billing holds them: columns in (window, agent) order.

/**
 * A report's rows as columns, in (window, agent) order: no object per row, because a month by agent and day is tens
 * of thousands of rows and the HTTP answer is written straight from these (report-views.ts `usageJsonBytes`).
 */
export interface UsageColumns {
  length: number;
  /** Each row's window: `[boundaries[window[i]], boundaries[window[i] + 1])`. */
  window: Int32Array;
  /** When grouped by agent: the distinct agents in order (Postgres's "C" collation), and each row's index into them. */
  agents?: string[];
  agent?: Int32Array;
  activeMs: Float64Array;
  vcpuMs: Float64Array;
  mibMs: Float64Array;
  /** Dozing time and its vCPU- and MiB-ms: not in the three active sums above. */
  dozedMs: Float64Array;
  dozedVcpuMs: Float64Array;
  dozedMibMs: Float64Array;
  /** Time hibernated (a snapshot held, VM stopped): from the VM event log, not from meter segments (`withHibernated`). */
  hibernatedMs: Float64Array;
}

/** The sums of a row, in the order a line carries them (`hibernatedMs` is added after the query, see `withHibernated`). */
export const lineSums = ["activeMs", "vcpuMs", "mibMs", "dozedMs", "dozedVcpuMs", "dozedMibMs"] as const;
type LineSums = readonly [Float64Array, Float64Array, Float64Array, Float64Array, Float64Array, Float64Array];

/**
 * Postgres's "C" collation, the order of agent ids: code points (UTF-8 bytes). `<` on JavaScript's UTF-16 agrees,
 * except that a surrogate (part of a code point past U+FFFF) must sort after U+E000–U+FFFF.
 */
export function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    const sx = x >= 0xd800 && x <= 0xdfff;
    const sy = y >= 0xd800 && y <= 0xdfff;
    return sx === sy ? x - y : sx ? 1 : -1;
  }
  return a.length - b.length;
}

/**
 * A grouped query (columns `w`, `agent_id` when by agent, `active_ms`, `vcpu_ms`, `mib_ms`, `dozed_ms`, `dozed_vcpu_ms`,
 * `dozed_mib_ms`) answered as one text value of lines in no order. Without agents a line is a row,
 * `w,active,vcpu,mib,dozed,dozedVcpu,dozedMib`.
 * By agent a line is an agent's rows, `w,…;w,…;…,"agent"`: the id once per agent (hundreds) instead of once per row
 * (thousands), last and JSON-quoted, so no id can break a line. One value instead of a row each: reading thousands of
 * rows of five columns cost the billing process more than the rest of the report (a string per column from the
 * driver), while Postgres writes a line for about what it spends sending a row.
 */
export function asLines(grouped: string, byAgent: boolean): string {
  const row = `w || ',' || active_ms || ',' || vcpu_ms || ',' || mib_ms || ',' || dozed_ms || ',' || dozed_vcpu_ms || ',' || dozed_mib_ms`;
  if (!byAgent) return `SELECT string_agg(${row}, E'\\n') AS lines FROM (${grouped}) g`;
  return `SELECT string_agg(r || ',' || to_json(agent_id)::text, E'\\n') AS lines FROM (SELECT agent_id, string_agg(${row}, ';') AS r FROM (${grouped}) g GROUP BY agent_id) a`;
}

const comma = 44;
const semicolon = 59;
const newline = 10;
const quote = 34;

/** Where `readRow` left the text: the position after the row and the character that ended it. */
interface Cursor {
  at: number;
  ended: number;
}

/**
 * Reads `w,active,vcpu,mib,dozed,dozedVcpu,dozedMib` at `cur.at` into row `row` of `win`/`sums`, digit by digit (no string per
 * number); every number an integer below 2^53, as `toNumber` requires, the window one of the query's (0 to 2^31).
 */
function readRow(text: string, cur: Cursor, row: number, win: Int32Array, sums: LineSums, line: number): void {
  let i = cur.at;
  let ch = 0;
  const fields = 1 + lineSums.length;
  for (let f = 0; f < fields; f++) {
    let neg = false;
    let v = 0;
    let digits = 0;
    ch = text.charCodeAt(i);
    if (ch === 45) {
      neg = true;
      ch = text.charCodeAt(++i);
    }
    for (; ch >= 48 && ch <= 57; ch = text.charCodeAt(++i), digits++) v = v * 10 + (ch - 48);
    if (digits === 0 || (f < fields - 1 && ch !== comma)) throw new Error(`unreadable usage line ${line}: ${JSON.stringify(text.slice(i - digits, i + 40))}`);
    if (v > Number.MAX_SAFE_INTEGER) throw new Error(`integer ${text.slice(i - digits, i)} exceeds 2^53`);
    if (f === 0) {
      if (neg || v >= 2 ** 31) throw new Error(`usage row in window ${v}`); // the queries' ranges are the windows'
      win[row] = v;
    } else sums[f - 1]![row] = neg ? -v : v;
    i++;
  }
  cur.at = i;
  cur.ended = ch;
}

/** Occurrences of character `ch` in `text` within `[from, to)`. */
function countOf(text: string, ch: string, from = 0, to = text.length): number {
  let n = 0;
  for (let p = text.indexOf(ch, from); p >= 0 && p < to; p = text.indexOf(ch, p + 1)) n++;
  return n;
}

/**
 * The lines of `asLines` read into columns in (window, agent) order: one query's text, or several (a report asked for
 * in parts, each part with other windows; an agent then has a line in each). The order is made here, not in the
 * query: sorting a month's aggregated rows cost Postgres about a third of its time, while here only the agents' lines
 * (hundreds) are compared as strings, their rows are read in agent order, and one stable counting pass by window puts
 * them in (window, agent) order.
 */
export function columnsOf(lines: string | null | undefined | readonly (string | null | undefined)[], byAgent: boolean): UsageColumns {
  const texts = (typeof lines === "string" ? [lines] : (lines ?? [])).filter((t): t is string => typeof t === "string" && t.length > 0);
  const sums = (n: number): LineSums => [
    new Float64Array(n),
    new Float64Array(n),
    new Float64Array(n),
    new Float64Array(n),
    new Float64Array(n),
    new Float64Array(n),
  ];
  const cur: Cursor = { at: 0, ended: 0 };
  if (!byAgent) {
    let n = 0;
    for (const text of texts) n += countOf(text, "\n") + 1;
    const win = new Int32Array(n);
    const s = sums(n);
    let row = 0;
    for (const text of texts) {
      cur.at = 0;
      for (let line = 1; cur.at < text.length; line++) {
        readRow(text, cur, row++, win, s, line);
        if (cur.ended !== newline && cur.at <= text.length)
          throw new Error(`unreadable usage line ${line}: ${JSON.stringify(text.slice(cur.at - 1, cur.at + 40))}`);
      }
    }
    return inWindowOrder(win, s, undefined, undefined);
  }
  // the lines: their text, where each starts, its agent (after the first quote: numbers have none), and their rows
  const textOf: string[] = [];
  const starts: number[] = [];
  const ids: string[] = [];
  let n = 0;
  for (const text of texts) {
    for (let p = 0; p < text.length; ) {
      const q = text.indexOf('"', p);
      if (q < 0 || q === p || text.charCodeAt(q - 1) !== comma)
        throw new Error(`unreadable usage line ${starts.length + 1}: ${JSON.stringify(text.slice(p, p + 40))}`);
      let e = text.indexOf("\n", q);
      if (e < 0) e = text.length;
      const quoted = text.slice(q, e);
      if (quoted.length < 2 || quoted.charCodeAt(quoted.length - 1) !== quote)
        throw new Error(`unreadable usage line ${starts.length + 1}: ${JSON.stringify(quoted.slice(0, 40))}`);
      // a JSON string: only ids with a quote, a backslash or a control character have escapes
      ids.push(quoted.includes("\\") ? (JSON.parse(quoted) as string) : quoted.slice(1, -1));
      textOf.push(text);
      starts.push(p);
      n += countOf(text, ";", p, q) + 1;
      p = e + 1;
    }
  }
  const byId = starts.map((_, k) => k).sort((a, b) => compareCodePoints(ids[a] as string, ids[b] as string));
  const agents: string[] = [];
  const win = new Int32Array(n);
  const agent = new Int32Array(n);
  const s = sums(n);
  let row = 0;
  for (const k of byId) {
    const id = ids[k] as string;
    const text = textOf[k] as string;
    if (agents.length === 0 || agents[agents.length - 1] !== id) agents.push(id);
    cur.at = starts[k] as number;
    do {
      readRow(text, cur, row, win, s, k + 1);
      if (cur.ended !== semicolon && cur.ended !== comma)
        throw new Error(`unreadable usage line ${k + 1}: ${JSON.stringify(text.slice(cur.at - 1, cur.at + 40))}`);
      agent[row++] = agents.length - 1;
    } while (cur.ended === semicolon);
    if (text.charCodeAt(cur.at) !== quote) throw new Error(`unreadable usage line ${k + 1}: ${JSON.stringify(text.slice(cur.at - 1, cur.at + 40))}`);
  }
  return inWindowOrder(win, s, agents, agent);
}

/** Rows (in agent order, when by agent) stably put in window order: one counting pass. */
function inWindowOrder(win: Int32Array, sums: LineSums, agents: string[] | undefined, agent: Int32Array | undefined): UsageColumns {
  const n = win.length;
  let windows = 0;
  for (let k = 0; k < n; k++) if ((win[k] as number) >= windows) windows = (win[k] as number) + 1;
  const next = new Uint32Array(windows + 1);
  for (let k = 0; k < n; k++) next[(win[k] as number) + 1]!++;
  for (let w = 0; w < windows; w++) next[w + 1]! += next[w] as number;
  const c = emptyColumns(n);
  const sorted = agent ? new Int32Array(n) : undefined;
  for (let k = 0; k < n; k++) {
    const w = win[k] as number;
    const j = next[w]!++;
    c.window[j] = w;
    if (sorted) sorted[j] = agent![k] as number;
    c.activeMs[j] = sums[0][k] as number;
    c.vcpuMs[j] = sums[1][k] as number;
    c.mibMs[j] = sums[2][k] as number;
    c.dozedMs[j] = sums[3][k] as number;
    c.dozedVcpuMs[j] = sums[4][k] as number;
    c.dozedMibMs[j] = sums[5][k] as number;
  }
  if (agents && sorted) {
    c.agents = agents;
    c.agent = sorted;
  }
  return c;
}

/** `n` rows of zeros, without agents. */
export function emptyColumns(n: number): UsageColumns {
  return {
    length: n,
    window: new Int32Array(n),
    activeMs: new Float64Array(n),
    vcpuMs: new Float64Array(n),
    mibMs: new Float64Array(n),
    dozedMs: new Float64Array(n),
    dozedVcpuMs: new Float64Array(n),
    dozedMibMs: new Float64Array(n),
    hibernatedMs: new Float64Array(n),
  };
}

/** Hibernated time of one (window, agent) pair; `agentId` absent when the report is not by agent. */
export interface HibernatedCell {
  window: number;
  agentId?: string;
  ms: number;
}

/**
 * `c` with the hibernated time of `cells` added: into the row of the same window (and agent), or as a row of its own
 * (an agent that only slept in a window has no metered row there), keeping (window, agent) order. Without cells, `c`.
 */
export function withHibernated(c: UsageColumns, cells: readonly HibernatedCell[]): UsageColumns {
  if (cells.length === 0) return c;
  const byAgent = c.agents !== undefined;
  const keyOf = (w: number, agentId: string | undefined) => (byAgent ? `${w}\u0000${agentId}` : String(w));
  const rows = new Map<string, { window: number; agentId: string | undefined; i: number; ms: number }>();
  for (let i = 0; i < c.length; i++) {
    const w = c.window[i] as number;
    const agentId = c.agents && c.agent ? c.agents[c.agent[i] as number] : undefined;
    rows.set(keyOf(w, agentId), { window: w, agentId, i, ms: 0 });
  }
  for (const cell of cells) {
    const key = keyOf(cell.window, cell.agentId);
    const row = rows.get(key);
    if (row) row.ms += cell.ms;
    else rows.set(key, { window: cell.window, agentId: byAgent ? cell.agentId : undefined, i: -1, ms: cell.ms });
  }
  const ordered = [...rows.values()].sort((a, b) => a.window - b.window || (byAgent ? compareCodePoints(a.agentId as string, b.agentId as string) : 0));
  const out = emptyColumns(ordered.length);
  const agents = byAgent ? [...new Set(ordered.map((r) => r.agentId as string))].sort(compareCodePoints) : undefined;
  const agentIndex = new Map(agents?.map((id, k) => [id, k]));
  const agent = byAgent ? new Int32Array(ordered.length) : undefined;
  ordered.forEach((r, j) => {
    out.window[j] = r.window;
    if (agent) agent[j] = agentIndex.get(r.agentId as string) as number;
    if (r.i >= 0) {
      out.activeMs[j] = c.activeMs[r.i] as number;
      out.vcpuMs[j] = c.vcpuMs[r.i] as number;
      out.mibMs[j] = c.mibMs[r.i] as number;
      out.dozedMs[j] = c.dozedMs[r.i] as number;
      out.dozedVcpuMs[j] = c.dozedVcpuMs[r.i] as number;
      out.dozedMibMs[j] = c.dozedMibMs[r.i] as number;
    }
    out.hibernatedMs[j] = (r.i >= 0 ? (c.hibernatedMs[r.i] as number) : 0) + r.ms;
  });
  if (agents && agent) {
    out.agents = agents;
    out.agent = agent;
  }
  return out;
}
