// The tenant's month: usage per day as plots, and the invoice preview (its lines and total, as the billing API computed them).
import { useState } from "preact/hooks";
import { getJson, withQuery } from "./api.ts";
import { localMonth } from "./format.ts";
import { formatCents, groupDigits } from "./money.ts";
import { usePoll } from "./poll.ts";
import { hrefs, Link } from "./route.tsx";
import { UsagePlots } from "./UsagePlots.tsx";
import type { Invoice, UsageReport } from "./types.ts";

const resourceNames: Record<string, string> = { vcpu: "vCPU time", memory: "memory", snapshot_storage: "snapshot storage" };

export function Usage() {
  const [month, setMonth] = useState(() => localMonth(Date.now()));
  const data = usePoll(
    async () => {
      const invoice = await getJson<Invoice>(withQuery("/v1/invoices", { month }));
      // The invoice's own period and zone (the tenant's), so the plot and the invoice count the same days.
      const usage = await getJson<UsageReport>(
        withQuery("/v1/usage", { from: invoice.periodStart, to: invoice.periodEnd, groupBy: "day", tz: invoice.timeZone }),
      );
      return { invoice, usage };
    },
    [month],
    10_000,
  );
  const d = data.data;
  return (
    <main>
      <h1>
        Usage <input type="month" aria-label="month" value={month} onChange={(e) => setMonth((e.target as HTMLInputElement).value || localMonth(Date.now()))} />
      </h1>
      {data.error ? (
        <p class="error" role="alert">
          {data.error.message}
        </p>
      ) : null}
      {d ? (
        <>
          <UsagePlots rows={d.usage.rows} from={Date.parse(d.invoice.periodStart)} to={Date.parse(d.invoice.periodEnd)} unit="day" rates={d.invoice.rates} />
          <section data-testid="invoice">
            <h2>
              Invoice {d.invoice.month}{" "}
              <span class={`status status-${d.invoice.status}`}>{d.invoice.status === "draft" ? "preview (draft)" : d.invoice.status}</span>
            </h2>
            <p class="muted">
              {d.invoice.periodStart} to {d.invoice.periodEnd} ({d.invoice.timeZone})
            </p>
            <table class="invoice">
              <thead>
                <tr>
                  <th>Agent</th>
                  <th>Resource</th>
                  <th class="num">Quantity</th>
                  <th class="num">Unit price</th>
                  <th class="num">Amount</th>
                </tr>
              </thead>
              <tbody>
                {d.invoice.lines.length === 0 ? (
                  <tr>
                    <td colSpan={5} class="muted">
                      Nothing billed this month yet.
                    </td>
                  </tr>
                ) : (
                  d.invoice.lines.map((l) => (
                    <tr key={`${l.agentId}/${l.resource}`}>
                      <td class="mono">
                        <Link href={hrefs.agent(l.agentId)}>{l.agentId}</Link>
                      </td>
                      <td>{resourceNames[l.resource] ?? l.resource}</td>
                      <td class="num">
                        {groupDigits(l.quantity)} {l.unit}
                      </td>
                      <td class="num">
                        {groupDigits(String(l.unitPriceNanocents))} nano-cents / {l.priceUnit}
                      </td>
                      <td class="num">
                        {formatCents(l.amountCents)} {d.invoice.currency}
                      </td>
                    </tr>
                  ))
                )}
              </tbody>
              <tfoot>
                <tr>
                  <th colSpan={4}>Total</th>
                  <th class="num" data-testid="invoice-total">
                    {d.invoice.total} {d.invoice.currency}
                  </th>
                </tr>
              </tfoot>
            </table>
          </section>
        </>
      ) : data.error ? null : (
        <p class="muted">Loading…</p>
      )}
    </main>
  );
}
