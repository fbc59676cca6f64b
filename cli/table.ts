// Text tables: columns as wide as their widest cell, cut with … to fit a terminal's width; plain (nothing cut) when not a terminal.

export interface Column {
  header: string;
  /** Numbers read better right-aligned. */
  align?: "left" | "right";
  /** The column may be cut to fit the width (ids and numbers should not be). */
  shrink?: boolean;
}

export interface TableOptions {
  /** Fit this many characters a line; undefined: nothing is cut. */
  width?: number | undefined;
  /** A line of dashes under the header. */
  rule?: boolean;
}

const gap = "  ";
/** A cut column keeps at least this many characters (its last one the …), and its header whole. */
const minCut = 4;

const length = (s: string) => [...s].length;

function cut(s: string, width: number): string {
  const chars = [...s];
  return chars.length <= width ? s : `${chars.slice(0, Math.max(width - 1, 0)).join("")}…`;
}

/** Widths that fit `limit`: the widest shrinkable column gives up a character until the line fits or none can give. */
function fitted(natural: number[], columns: readonly Column[], limit: number | undefined): number[] {
  const widths = [...natural];
  if (limit === undefined) return widths;
  let excess = widths.reduce((a, b) => a + b, 0) + gap.length * (widths.length - 1) - limit;
  while (excess > 0) {
    let widest = -1;
    widths.forEach((w, i) => {
      if (columns[i]!.shrink && w > Math.max(minCut, length(columns[i]!.header)) && (widest < 0 || w > widths[widest]!)) widest = i;
    });
    if (widest < 0) break;
    widths[widest]!--;
    excess--;
  }
  return widths;
}

/** The table as lines of text (no trailing spaces). */
export function renderTable(columns: readonly Column[], rows: readonly (readonly string[])[], opts: TableOptions = {}): string {
  const natural = columns.map((c, i) => Math.max(length(c.header), ...rows.map((r) => length(r[i] ?? ""))));
  const widths = fitted(natural, columns, opts.width);
  const line = (cells: readonly string[]) =>
    columns
      .map((c, i) => {
        const text = cut(cells[i] ?? "", widths[i]!);
        const pad = " ".repeat(widths[i]! - length(text));
        return c.align === "right" ? pad + text : text + pad;
      })
      .join(gap)
      .trimEnd();
  const out = [line(columns.map((c) => c.header))];
  if (opts.rule) out.push(widths.map((w) => "-".repeat(w)).join(gap));
  for (const r of rows) out.push(line(r));
  return out.join("\n");
}

/** The width tables on stdout fit: the terminal's, or none when stdout is a pipe or a file. */
export function terminalWidth(stream: { isTTY?: boolean; columns?: number } = process.stdout): number | undefined {
  return stream.isTTY && stream.columns ? stream.columns : undefined;
}
