// Structured JSON-lines logging; every line about a request carries its request id.

export type LogLevel = "debug" | "info" | "warn" | "error";
const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(fields: Record<string, unknown>): Logger;
}

export function createLogger(opts: { level?: LogLevel; write?: (line: string) => void; base?: Record<string, unknown> } = {}): Logger {
  const min = rank[opts.level ?? "info"];
  const write = opts.write ?? ((line: string) => console.error(line));
  const base = opts.base ?? {};
  const emit = (level: LogLevel, msg: string, fields?: Record<string, unknown>) => {
    if (rank[level] < min) return;
    const entry: Record<string, unknown> = { t: new Date().toISOString(), level, msg, ...base, ...fields };
    for (const [k, v] of Object.entries(entry)) if (v instanceof Error) entry[k] = { name: v.name, message: v.message };
    write(JSON.stringify(entry));
  };
  return {
    debug: (m, f) => emit("debug", m, f),
    info: (m, f) => emit("info", m, f),
    warn: (m, f) => emit("warn", m, f),
    error: (m, f) => emit("error", m, f),
    child: (fields) => createLogger({ ...opts, base: { ...base, ...fields } }),
  };
}

export const silentLogger: Logger = {
  debug() {},
  info() {},
  warn() {},
  error() {},
  child: () => silentLogger,
};
