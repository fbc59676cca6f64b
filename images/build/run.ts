// Runs one of the image tools as a child process: its output line by line, a bounded tail for error messages, abortable.
import { spawn } from "node:child_process";

export interface RunOptions {
  /** Every line of stdout and stderr, as it comes (interleaved in arrival order). */
  onLine?: (line: string) => void;
  signal?: AbortSignal;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Lines kept for the result (the tail an error message quotes). */
  keepLines?: number;
}

export interface RunResult {
  code: number | null;
  /** The last `keepLines` lines of stdout and stderr together. */
  tail: string[];
  /** All of stdout (for commands whose answer is their output, e.g. `buildah inspect`). */
  stdout: string;
}

/**
 * Spawns `cmd args`, never through a shell. An abort sends SIGTERM (SIGKILL 5 s later) and rejects with the
 * signal's reason once the process has exited, so nothing of ours still writes into a directory being removed.
 */
export function run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
  const keep = opts.keepLines ?? 40;
  return new Promise((resolve, reject) => {
    if (opts.signal?.aborted) return reject(opts.signal.reason);
    const child = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: opts.env ?? process.env, ...(opts.cwd ? { cwd: opts.cwd } : {}) });
    const tail: string[] = [];
    let stdout = "";
    const partial = { out: "", err: "" };
    const emit = (line: string) => {
      tail.push(line);
      if (tail.length > keep) tail.shift();
      opts.onLine?.(line);
    };
    const feed = (which: "out" | "err", chunk: Buffer) => {
      const text = partial[which] + chunk.toString("utf8");
      const lines = text.split(/\r?\n|\r/);
      partial[which] = lines.pop() ?? "";
      for (const line of lines) emit(line);
    };
    child.stdout.on("data", (c: Buffer) => {
      stdout += c.toString("utf8");
      feed("out", c);
    });
    child.stderr.on("data", (c: Buffer) => feed("err", c));
    let killTimer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      child.kill("SIGTERM");
      killTimer = setTimeout(() => child.kill("SIGKILL"), 5000);
    };
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    child.on("error", (err) => {
      opts.signal?.removeEventListener("abort", onAbort);
      reject(err);
    });
    child.on("close", (code) => {
      opts.signal?.removeEventListener("abort", onAbort);
      if (killTimer) clearTimeout(killTimer);
      for (const which of ["out", "err"] as const) if (partial[which]) emit(partial[which]);
      if (opts.signal?.aborted) return reject(opts.signal.reason);
      resolve({ code, tail, stdout });
    });
  });
}

/** The last lines of a tool's output, for an error message (blank lines dropped). */
export function tailText(lines: string[], n = 15): string {
  return lines
    .filter((l) => l.trim() !== "")
    .slice(-n)
    .join("\n");
}
