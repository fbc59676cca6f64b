// `agentvm invoices [ls|show ID|show YYYY-MM]`: the tenant's invoices and one invoice's lines.
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import { CliError, exitCodes } from "./exit.ts";
import { integer } from "./options.ts";
import { renderTable, terminalWidth, type Column } from "./table.ts";
import { msToSeconds } from "./usage.ts";

export type InvoiceBody = Pick<components["schemas"]["Invoice"], "id" | "month" | "status" | "cutoffAt" | "currency" | "total" | "lines"> &
  Partial<Pick<components["schemas"]["Invoice"], "rateCards" | "time">>;
type InvoiceSummary = components["schemas"]["InvoiceSummary"];

const monthPattern = /^\d{4}-\d{2}$/;

/**
 * An invoice: its head line, a table of its lines (each with the rate-card version that priced it), each agent's active,
 * dozed and hibernated time, the cards, its total.
 */
export function renderInvoice(inv: InvoiceBody, width?: number): string {
  const columns: Column[] = [
    { header: "agent" },
    { header: "resource" },
    { header: "quantity", align: "right" },
    { header: "unit price", align: "right" },
    { header: "amount", align: "right" },
    { header: "card" },
  ];
  const rows = inv.lines.map((l) => [
    l.agentId,
    l.resource,
    `${l.quantity} ${l.unit}`,
    `${l.unitPriceNanocents} n¢/${l.priceUnit}`,
    `${l.amountCents} ¢`,
    l.rateCardId ?? "-",
  ]);
  const time = (inv.time ?? []).map(
    (t) => `agent ${t.agentId}: active ${msToSeconds(t.activeMs)} s, dozed ${msToSeconds(t.dozedMs)} s, hibernated ${msToSeconds(t.hibernatedMs)} s`,
  );
  const cards = (inv.rateCards ?? []).map((c) => `card ${c.id}${c.tenantId === null ? " (default)" : ""} priced ${c.from} to ${c.to}`);
  return `invoice ${inv.id} for ${inv.month} (${inv.status}; segments received before ${inv.cutoffAt})\n${renderTable(columns, rows, { width, rule: true })}\n${[...time, ...cards].map((c) => `${c}\n`).join("")}total ${inv.total} ${inv.currency}`;
}

export function invoicesCommand(program: Command): void {
  const invoices = program.command("invoices").description("your invoices (ls, the default) and one invoice (show)");

  invoices
    .command("ls", { isDefault: true })
    .description("list your invoices, newest month first (every page)")
    .option("--limit <n>", "at most this many invoices", integer(1, 1_000_000))
    .action(async (o: { limit?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(await api.GET("/v1/invoices", { params: { query: { limit, ...(cursor ? { cursor } : {}) } } }));
        if (!("invoices" in page)) throw new CliError(exitCodes.server, "the gateway answered one invoice where a list was asked for");
        return { items: page.invoices, nextCursor: page.nextCursor };
      }, o.limit);
      if (ctx.json) return ctx.printJson({ invoices: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(
        [{ header: "ID" }, { header: "MONTH" }, { header: "STATUS" }, { header: "TOTAL", align: "right" }],
        listed.items.map((i: InvoiceSummary) => [
          i.id,
          i.month,
          i.status,
          i.totalCents === null ? "(draft: show it)" : `${(i.totalCents / 100).toFixed(2)} ${i.currency}`,
        ]),
      );
    });

  invoices
    .command("show")
    .description("one invoice by id, or a month's (YYYY-MM; a draft until the month is final)")
    .argument("<id|month>", "inv_… or YYYY-MM")
    .option("--csv", "the API's CSV")
    .action(async (which: string, o: { csv?: boolean }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const format = o.csv ? { format: "csv" as const } : {};
      const init = { ...(o.csv ? { headers: { accept: "text/csv" }, parseAs: "text" as const } : {}) };
      const answer = monthPattern.test(which)
        ? await api.GET("/v1/invoices", { params: { query: { month: which, ...format } }, ...init })
        : await api.GET("/v1/invoices/{id}", { params: { path: { id: which }, query: format }, ...init });
      const body = ok(answer) as unknown;
      if (o.csv) return void process.stdout.write(String(body));
      if (ctx.json) return ctx.printJson(body);
      ctx.print(renderInvoice(body as InvoiceBody, terminalWidth()));
    });
}
