// RFC 4180 CSV: quoted only where needed, CRLF line ends, a header row first.

export type Cell = string | number | bigint | undefined | null;

function cell(v: Cell): string {
  if (v === undefined || v === null) return "";
  const s = String(v);
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function toCsv(header: readonly string[], rows: readonly (readonly Cell[])[]): string {
  return `${[header, ...rows].map((r) => r.map(cell).join(",")).join("\r\n")}\r\n`;
}
