// Operator CLI over the usage API: `npm run usage -- --from 2026-03-01 --to 2026-04-01 [--tz …] [--group-by agent,day] [--csv]` (tables drawn by cli/, as `agentvm usage` draws them).
import { parseArgs } from "node:util";
import { renderInvoice, type InvoiceBody } from "../cli/invoices.ts";
import { renderUsage, type UsageBody } from "../cli/usage.ts";
import { runIfMain } from "../lib/node-main.ts";

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
    console.error(`no token: pass --token or set AGENTVM_TOKEN (a bearer token with usage:read)\n\n${help}`);
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
      console.error(`--from and --to are required\n\n${help}`);
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

runIfMain(import.meta.url, main);
