// `agentvm usage`: active, dozed and hibernated seconds, vCPU-seconds and GiB-seconds over a range in a time zone, as a table, CSV or JSON.
import { Option, type Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import { usageError } from "./exit.ts";
import { list } from "./options.ts";
import { renderTable, type Column } from "./table.ts";

export type UsageBody = Pick<components["schemas"]["Usage"], "timeZone" | "source" | "rows" | "totals">;

/** `12345` ms → `12.345` (exact: integer arithmetic). */
export function msToSeconds(ms: number): string {
  const sign = ms < 0 ? "-" : "";
  const abs = Math.abs(ms);
  return `${sign}${Math.floor(abs / 1000)}.${String(abs % 1000).padStart(3, "0")}`;
}

/** MiB-ms → GiB-s with three decimals. */
const gibSeconds = (mibMs: number) => (mibMs / 1_024_000).toFixed(3);

type Sums = UsageBody["totals"];

/** A row's figures in the table's order: time by state, then the active vCPU- and GiB-seconds (older answers lack the newer sums: 0). */
const figures = (r: Sums) => [
  msToSeconds(r.activeMs),
  msToSeconds(r.dozedMs ?? 0),
  msToSeconds(r.hibernatedMs ?? 0),
  msToSeconds(r.vcpuMs),
  gibSeconds(r.mibMs),
];

/** The usage as a table with a total row and a line naming the zone and the source, fit to `width` when given. */
export function renderUsage(body: UsageBody, width?: number): string {
  const byAgent = body.rows.some((r) => r.agentId !== undefined);
  const columns: Column[] = [
    { header: "window start" },
    ...(byAgent ? [{ header: "agent" }] : []),
    { header: "active s", align: "right" },
    { header: "dozed s", align: "right" },
    { header: "hibernated s", align: "right" },
    { header: "vCPU-s", align: "right" },
    { header: "GiB-s", align: "right" },
  ];
  const rows = body.rows.map((r) => [r.start, ...(byAgent ? [r.agentId ?? ""] : []), ...figures(r)]);
  rows.push(["total", ...(byAgent ? [""] : []), ...figures(body.totals)]);
  return `${renderTable(columns, rows, { width, rule: true })}\n(time zone ${body.timeZone}, from ${body.source === "rollup" ? "15-minute rollups" : "raw segments"})`;
}

/** This month in `zone` as `[YYYY-MM-01, first of next month)`: what `usage` shows without --from and --to. */
export function thisMonth(zone: string, now: number): { from: string; to: string } {
  let parts: Intl.DateTimeFormatPart[];
  try {
    parts = new Intl.DateTimeFormat("en-CA", { timeZone: zone, year: "numeric", month: "2-digit" }).formatToParts(now);
  } catch {
    throw usageError(`--zone: "${zone}" is not an IANA time zone (like Europe/Paris or UTC)`);
  }
  const year = Number(parts.find((p) => p.type === "year")!.value);
  const month = Number(parts.find((p) => p.type === "month")!.value);
  const next = month === 12 ? { year: year + 1, month: 1 } : { year, month: month + 1 };
  const day1 = (y: number, m: number) => `${String(y).padStart(4, "0")}-${String(m).padStart(2, "0")}-01`;
  return { from: day1(year, month), to: day1(next.year, next.month) };
}

export function usageCommand(program: Command): void {
  program
    .command("usage")
    .description("usage over a half-open range: active, dozed and hibernated seconds, vCPU-seconds, GiB-seconds (default: this month so far)")
    .option("--from <when>", "start (inclusive): YYYY-MM-DD (that day's start in --zone) or an ISO 8601 instant")
    .option("--to <when>", "end (exclusive), same forms")
    .option("--zone <zone>", "IANA time zone of days and hours, like Europe/Paris", "UTC")
    .addOption(new Option("--tz <zone>", "same as --zone (npm run usage's name)").hideHelp())
    .option("--group-by <list>", "comma list of agent, hour, day", list)
    .option("--agent <id>", "only this agent")
    .option("--csv", "the API's CSV")
    .action(async (opts: { from?: string; to?: string; zone: string; tz?: string; groupBy?: string[]; agent?: string; csv?: boolean }, cmd: Command) => {
      const o = { ...opts, zone: opts.tz ?? opts.zone };
      const ctx = contextOf(cmd);
      if (o.csv && ctx.json) throw usageError("--csv or --json, not both");
      const month = thisMonth(o.zone, Date.now());
      const query = {
        from: o.from ?? month.from,
        to: o.to ?? month.to,
        tz: o.zone,
        ...(o.groupBy?.length ? { groupBy: o.groupBy.join(",") } : {}),
        ...(o.agent ? { agentId: o.agent } : {}),
      };
      const api = ctx.api();
      if (o.csv) {
        const csv = ok(await api.GET("/v1/usage", { params: { query: { ...query, format: "csv" } }, headers: { accept: "text/csv" }, parseAs: "text" }));
        return void process.stdout.write(csv);
      }
      const usage = ok(await api.GET("/v1/usage", { params: { query } }));
      if (ctx.json) ctx.printJson(usage);
      else ctx.print(renderUsage(usage, process.stdout.isTTY ? process.stdout.columns : undefined));
    });
}
