// Booting a built image's VM: reading the guest console for what the init says while the host waits (an entrypoint
// that exited, a drive that would not mount), and the image's readiness probe on its own port.
import { closeSync, openSync, readSync, statSync } from "node:fs";
import { request } from "node:http";
import type { ImageConfig } from "../../../contracts/image.ts";
import { pollUntil } from "./readiness.ts";
import { requestOptions } from "../../../lib/node-net.ts";
import type { VmEndpoint } from "../driver.ts";

/** The init's lines that end a boot (fleet-agent/guest/init.sh): the entrypoint exited, or the image could not be set up. */
const FAILURE_LINE = /^agentvm: (entrypoint exited with status \d+|image setup failed: .*)$/m;
/** How much of the console an error message carries. */
const TAIL_LINES = 12;
const TAIL_CHARS = 1500;
/** Console bytes kept in memory from the boot's start (the tail and the failure line are all we need of them). */
const KEEP_CHARS = 64 << 10;

/** The guest console from a point on (the boot's start): polled for the init's failure line, and its tail for errors. */
export class ConsoleWatch {
  private readonly path: string;
  private offset: number;
  private text = "";

  /** Watches `path` from its current end. */
  constructor(path: string) {
    this.path = path;
    this.offset = fileSize(path);
  }

  /** Reads what was appended since the last call; answers the init's failure line once it appeared. */
  failure(): string | undefined {
    this.read();
    return FAILURE_LINE.exec(this.text)?.[1];
  }

  /**
   * The process the guest kernel's OOM killer ended since the watch began (`python3 (pid 812)`), if it did: an agent
   * given too little memory boots its kernel, then loses its entrypoint to the OOM killer and the VM ends, which
   * otherwise reads as a bare "QEMU exited (code 0)".
   */
  outOfMemory(): string | undefined {
    this.read();
    const m = /Out of memory: Killed process (\d+) \(([^)]*)\)/.exec(this.text);
    return m ? `${m[2]} (pid ${m[1]})` : undefined;
  }

  /** The last lines written since the watch began, joined by " | " (for error messages). */
  tail(): string {
    this.read();
    const lines = this.text
      .replace(/\r/g, "")
      .split("\n")
      .map((l) => l.trimEnd())
      .filter(Boolean)
      .slice(-TAIL_LINES);
    const joined = lines.join(" | ");
    return joined.length > TAIL_CHARS ? `…${joined.slice(-TAIL_CHARS)}` : joined;
  }

  private read(): void {
    let fd: number;
    try {
      fd = openSync(this.path, "r");
    } catch {
      return;
    }
    try {
      const size = fileSize(this.path);
      if (size < this.offset) this.offset = 0; // truncated (rotated) meanwhile
      const chunk = Buffer.alloc(Math.min(size - this.offset, KEEP_CHARS));
      const n = chunk.length ? readSync(fd, chunk, 0, chunk.length, size - chunk.length) : 0;
      this.offset = size;
      this.text = (this.text + chunk.toString("utf8", 0, n)).slice(-KEEP_CHARS);
    } finally {
      closeSync(fd);
    }
  }
}

function fileSize(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    return 0;
  }
}

/**
 * Resolves once the image's agent is ready: with `readyPath`, GET on it answers 2xx–4xx (the image asked for that
 * probe); without, a socket in the guest listens on its port, asked of the guest agent (`listening`), so the workload
 * gets no request it did not ask for (a probe it would see and count as a call). A guest too old to answer that, or no
 * guest agent, falls back to any HTTP answer to GET /healthz (under QEMU's user networking an accepted TCP connection
 * proves nothing: the host side accepts it before the guest does).
 */
export function waitImageReady(
  endpoint: VmEndpoint,
  config: Pick<ImageConfig, "readyPath" | "port">,
  opts: { deadline: number; gaveUp: () => string | undefined; listening?: (port: number, timeoutMs: number) => Promise<boolean | undefined> },
): Promise<void> {
  const path = config.readyPath ?? "/healthz";
  const okStatus = config.readyPath ? (s: number) => s >= 200 && s < 500 : () => true;
  let askGuest = config.readyPath === undefined && opts.listening !== undefined;
  return pollUntil(
    async (remaining) => {
      const timeoutMs = Math.min(2000, Math.max(100, remaining));
      if (askGuest) {
        const listens = await opts.listening!(config.port, timeoutMs).catch(() => false);
        if (listens !== undefined) return listens ? true : undefined;
        askGuest = false; // a guest built before LISTENING: the HTTP probe from now on
      }
      const status = await httpStatus(endpoint, path, timeoutMs);
      return status !== undefined && okStatus(status) ? true : undefined;
    },
    {
      deadline: opts.deadline,
      gaveUp: opts.gaveUp,
      timeout: config.readyPath
        ? `the agent did not answer HTTP on port ${config.port} (GET ${config.readyPath}) within the boot timeout`
        : `the agent did not listen on port ${config.port} within the boot timeout`,
    },
  ).then(() => undefined);
}

/** The status of a GET at `endpoint`, or undefined when nothing answered within the timeout. */
function httpStatus(endpoint: VmEndpoint, path: string, timeoutMs: number): Promise<number | undefined> {
  return new Promise((resolve) => {
    const req = request({ ...requestOptions(endpoint), path, method: "GET", agent: false, timeout: timeoutMs }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
      res.on("error", () => resolve(undefined));
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => resolve(undefined));
    req.end();
  });
}

/** A boot failure's first words when the guest ran out of memory (`ConsoleWatch.outOfMemory`), else "". */
export function outOfMemoryHint(watch: ConsoleWatch | undefined, memMiB: number): string {
  const killed = watch?.outOfMemory();
  return killed ? `the guest ran out of memory with memMiB ${memMiB}: its kernel killed ${killed}; create the agent with a larger memMiB. ` : "";
}
