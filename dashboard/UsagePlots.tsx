// Active (and dozed) seconds and estimated cost per hour or day, from the usage API's rows and a rate card.
import { costMicros, formatMicros } from "./money.ts";
import { Plot } from "./Plot.tsx";
import type { Rates, UsageRow } from "./types.ts";

export function UsagePlots(props: { rows: UsageRow[]; from: number; to: number; unit: "hour" | "day"; rates: Rates | undefined }) {
  const windows = props.rows.map((r) => ({ start: Date.parse(r.start), end: Date.parse(r.end), row: r }));
  const active = windows.map((w) => ({ start: w.start, end: w.end, value: w.row.activeMs / 1000 }));
  const dozed = windows.map((w) => ({ start: w.start, end: w.end, value: w.row.dozedMs / 1000 }));
  // an agent that never dozed gets no empty plot
  const dozedAtAll = dozed.some((p) => p.value > 0);
  const rates = props.rates;
  // Micro-units are whole numbers (BigInt underneath); as plot heights they are only positions.
  const cost = rates ? windows.map((w) => ({ start: w.start, end: w.end, value: Number(costMicros(w.row, rates)) })) : [];
  const per = props.unit === "hour" ? "hour" : "day";
  return (
    <div class="plots">
      <Plot
        kind="active"
        title={`Active seconds per ${per}`}
        points={active}
        from={props.from}
        to={props.to}
        unit={props.unit}
        format={(v) => `${Number(v.toPrecision(6))} s`}
      />
      {dozedAtAll ? (
        <Plot
          kind="dozed"
          title={`Dozed seconds per ${per} (vCPUs stopped while waiting on an outbound call; not active time)`}
          points={dozed}
          from={props.from}
          to={props.to}
          unit={props.unit}
          format={(v) => `${Number(v.toPrecision(6))} s`}
        />
      ) : null}
      {rates ? (
        <Plot
          kind="cost"
          title={`Estimated cost per ${per} (${rates.currency}, at the rate card)`}
          points={cost}
          from={props.from}
          to={props.to}
          unit={props.unit}
          integer
          format={(v) => formatMicros(BigInt(Math.round(v)))}
        />
      ) : null}
    </div>
  );
}
