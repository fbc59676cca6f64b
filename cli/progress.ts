// Progress of long work on stderr: a ticking line with the time so far on a terminal, plain lines in a log or a pipe.
import { formatDuration } from "./duration.ts";

export interface Progress {
  /** Changes what the ticking line says. */
  status(text: string): void;
  /** A line that stays (a build step, a log line), printed above the ticking line. */
  line(text: string): void;
  /** Ends the progress; `text` stays as its last line. */
  done(text?: string): void;
  /** Time since the start, ms. */
  elapsedMs(): number;
}

interface ProgressStream {
  isTTY?: boolean;
  write(text: string): unknown;
}

const frames = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
const tickMs = 100;

export function startProgress(label: string, opts: { stream?: ProgressStream; now?: () => number } = {}): Progress {
  const stream = opts.stream ?? process.stderr;
  const now = opts.now ?? (() => performance.now());
  const started = now();
  const elapsedMs = () => now() - started;
  let text = label;
  if (!stream.isTTY) {
    stream.write(`${label}…\n`);
    return {
      status: (t) => void (text = t),
      line: (t) => void stream.write(`${t}\n`),
      done: (t) => void (t !== undefined && stream.write(`${t}\n`)),
      elapsedMs,
    };
  }
  let frame = 0;
  const clear = () => stream.write("\r\x1b[K");
  const draw = () => stream.write(`\r\x1b[K${frames[frame++ % frames.length]} ${text} ${formatDuration(elapsedMs())}`);
  const timer = setInterval(draw, tickMs);
  timer.unref();
  draw();
  return {
    status(t) {
      text = t;
      draw();
    },
    line(t) {
      clear();
      stream.write(`${t}\n`);
      draw();
    },
    done(t) {
      clearInterval(timer);
      clear();
      if (t !== undefined) stream.write(`${t}\n`);
    },
    elapsedMs,
  };
}
