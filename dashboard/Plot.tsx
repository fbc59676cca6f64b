// A bar plot of usage windows over time, drawn as SVG (no chart library): value axis, time labels, a title per bar.
import { bars, timeTicks, valueScale, type PlotPoint } from "./plot.ts";

const width = 640;
const height = 160;
const margin = { left: 64, right: 8, top: 8, bottom: 22 };

export interface PlotProps {
  title: string;
  points: PlotPoint[];
  from: number;
  to: number;
  unit: "hour" | "day";
  /** Writes a value for the axis and the bars' titles. */
  format: (value: number) => string;
  /** Values are whole units (micro-units of money): the axis steps by at least 1. */
  integer?: boolean;
  kind: "active" | "dozed" | "cost";
}

export function Plot(props: PlotProps) {
  const inner = { width: width - margin.left - margin.right, height: height - margin.top - margin.bottom };
  const max = props.points.reduce((m, p) => Math.max(m, p.value), 0);
  const scale = valueScale(max, 4, { integer: props.integer ?? false });
  const rects = bars(props.points, props.from === props.to ? { from: props.from, to: props.from + 1 } : props, inner, scale.top);
  const ticks = timeTicks(props, inner.width, props.unit);
  const y = (v: number) => inner.height - (v / scale.top) * inner.height;
  return (
    <figure class={`plot plot-${props.kind}`} data-testid={`plot-${props.kind}`}>
      <figcaption>{props.title}</figcaption>
      <svg viewBox={`0 0 ${width} ${height}`} role="img" aria-label={props.title}>
        <g transform={`translate(${margin.left},${margin.top})`}>
          {scale.ticks.map((v) => (
            <g key={`y${v}`} class="tick">
              <line x1={0} x2={inner.width} y1={y(v)} y2={y(v)} />
              <text x={-6} y={y(v)} dy="0.32em" text-anchor="end">
                {props.format(v)}
              </text>
            </g>
          ))}
          {rects.map((b) => (
            <rect key={b.point.start} class="bar" x={b.x} y={b.y} width={b.width} height={b.height}>
              <title>{`${new Date(b.point.start).toLocaleString()}: ${props.format(b.point.value)}`}</title>
            </rect>
          ))}
          {ticks.map((t) => (
            <text key={`x${t.x}`} class="time" x={t.x} y={inner.height + 16} text-anchor="middle">
              {t.label}
            </text>
          ))}
          <line class="axis" x1={0} x2={inner.width} y1={inner.height} y2={inner.height} />
        </g>
      </svg>
      {props.points.length === 0 ? <p class="muted">No usage in this range yet.</p> : null}
    </figure>
  );
}
