// Operator CLI over the usage API: `npm run usage -- --from 2026-03-01 --to 2026-04-01 [--tz …] [--group-by agent,day] [--csv]`.
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const help = `usage: npm run usage -- --from <date|instant> --to <date|instant> [options]

  --from, --to     half-open range: YYYY-MM-DD (start of that day in --tz) or ISO 8601 with Z/offset
  --tz             IANA time zone for days and hours (default UTC)
  --group-by       comma list of agent, hour, day (default: totals only)
  --agent          only this agent
  --tenant         the tenant the token belongs to (checked by the server; optional)
  --invoice        YYYY-MM: print that month's invoice instead of usage
  --csv | --json   raw CSV or JSON from the API instead of a table
  --url            billing/gateway base URL (default http://127.0.0.1:8080)
  --token          bearer token with usage:read (default: $AGENTVM_TOKEN)`;

interface UsageBody {
  timeZone: string;
  source: string;
  rows: { start: string; end: string; agentId?: string; activeMs: number; vcpuMs: number; mibMs: number }[];
  totals: { activeMs: number; vcpuMs: number; mibMs: number };
}

interface InvoiceBody {
  id: string;
  month: string;
  status: string;
  cutoffAt: string;
  currency: string;
  total: string;
  lines: { agentId: string; resource: string; quantity: string; unit: string; unitPriceNanocents: number; priceUnit: string; amountCents: number }[];
}

/** `12345` ms → `12.345` (exact: integer arithmetic). */
export function msToSeconds(ms: number): string {
  const sign = ms < 0 ? "-" : "";
  const abs = Math.abs(ms);
  return `${sign}${Math.floor(abs / 1000)}.${String(abs % 1000).padStart(3, "0")}`;
}

function table(header: string[], rows: string[][], rightAlign: Set<number>): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (r: string[]) => r.map((c, i) => (rightAlign.has(i) ? c.padStart(widths[i]!) : c.padEnd(widths[i]!))).join("  ").trimEnd();
  return [line(header), widths.map((w) => "-".repeat(w)).join("  "), ...rows.map(line)].join("\n");
}

export function renderUsage(body: UsageBody): string {
  const byAgent = body.rows.some((r) => r.agentId !== undefined);
  const header = ["window start", ...(byAgent ? ["agent"] : []), "active s", "vCPU-s", "GiB-s"];
  const gib = (mibMs: number) => (mibMs / 1_024_000).toFixed(3);
  const rows = body.rows.map((r) => [r.start, ...(byAgent ? [r.agentId ?? ""] : []), msToSeconds(r.activeMs), msToSeconds(r.vcpuMs), gib(r.mibMs)]);
  rows.push(["total", ...(byAgent ? [""] : []), msToSeconds(body.totals.activeMs), msToSeconds(body.totals.vcpuMs), gib(body.totals.mibMs)]);
  const first = byAgent ? 2 : 1;
  return `${table(header, rows, new Set([first, first + 1, first + 2]))}\n(time zone ${body.timeZone}, from ${body.source === "rollup" ? "15-minute rollups" : "raw segments"})`;
}

export function renderInvoice(inv: InvoiceBody): string {
  const rows = inv.lines.map((l) => [l.agentId, l.resource, `${l.quantity} ${l.unit}`, `${l.unitPriceNanocents} n¢/${l.priceUnit}`, `${l.amountCents} ¢`]);
  return `invoice ${inv.id} for ${inv.month} (${inv.status}; segments received before ${inv.cutoffAt})\n${table(["agent", "resource", "quantity", "unit price", "amount"], rows, new Set([2, 3, 4]))}\ntotal ${inv.total} ${inv.currency}`;
}

async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      from: { type: "string" },
      to: { type: "string" },
      tz: { type: "string", default: "UTC" },
      "group-by": { type: "string" },
      agent: { type: "string" },
      tenant: { type: "string" },
      invoice: { type: "string" },
      csv: { type: "boolean", default: false },
      json: { type: "boolean", default: false },
      url: { type: "string", default: "http://127.0.0.1:8080" },
      token: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(help);
    return 0;
  }
  const token = values.token ?? process.env.AGENTVM_TOKEN;
  if (!token) {
    console.error("no token: pass --token or set AGENTVM_TOKEN (a bearer token with usage:read)\n\n" + help);
    return 2;
  }
  const base = values.url.replace(/\/+$/, "");
  const q = new URLSearchParams();
  let path: string;
  if (values.invoice) {
    path = "/v1/invoices";
    q.set("month", values.invoice);
  } else {
    if (!values.from || !values.to) {
      console.error("--from and --to are required\n\n" + help);
      return 2;
    }
    path = "/v1/usage";
    q.set("from", values.from);
    q.set("to", values.to);
    q.set("tz", values.tz);
    if (values["group-by"]) q.set("groupBy", values["group-by"]);
    if (values.agent) q.set("agentId", values.agent);
  }
  if (values.tenant) q.set("tenantId", values.tenant);
  if (values.csv) q.set("format", "csv");
  const res = await fetch(`${base}${path}?${q}`, { headers: { authorization: `Bearer ${token}`, accept: values.csv ? "text/csv" : "application/json" } });
  const text = await res.text();
  if (!res.ok) {
    let message = text;
    try {
      const e = JSON.parse(text) as { error?: { code?: string; message?: string } };
      if (e.error) message = `${e.error.code}: ${e.error.message}`;
    } catch {
      /* not the JSON envelope */
    }
    console.error(`${res.status} ${message}`);
    return 1;
  }
  if (values.csv || values.json) process.stdout.write(text.endsWith("\n") ? text : `${text}\n`);
  else console.log(values.invoice ? renderInvoice(JSON.parse(text) as InvoiceBody) : renderUsage(JSON.parse(text) as UsageBody));
  return 0;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === resolve(process.argv[1])) {
  main(process.argv.slice(2)).then(
    (code) => (process.exitCode = code),
    (err: unknown) => {
      console.error(err instanceof Error ? err.message : String(err));
      process.exitCode = 1;
    },
  );
}
