// Agent logs on the host: rotation (rule, timer, the copy aside), the tail across `<log>.1` + `<log>` from a line start, and follows through appends, truncations and rotations.
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ManualClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { LogRotator, openLogStream, rotateIfPast, type LogFs } from "../../fleet-agent/agent-logs.ts";
import { capLog, LOG_MAX_BYTES, rotateLog } from "../../fleet-agent/drivers/common/vm-process.ts";
import { defaultLogTailBytes, logEventStream, maxLogTailBytes, parseFollow, parseTail } from "../../gateway/logs/routes.ts";

let dir: string;
let log: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "agentvm-logs-"));
  log = join(dir, "workload.log");
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

/** A writer as the real ones are: the log held open in append mode. */
function appender(path: string) {
  const fd = openSync(path, "a");
  return { write: (text: string) => void writeSync(fd, text), close: () => closeSync(fd) };
}

async function readAll(stream: ReadableStream<Uint8Array>): Promise<string> {
  return new Response(stream).text();
}

/** Reads from a follow until `want` is in what arrived (fails after `ms`). */
async function readUntil(reader: ReadableStreamDefaultReader<Uint8Array>, got: { text: string }, want: string, ms = 2000): Promise<number> {
  const started = Date.now();
  const decoder = new TextDecoder();
  while (!got.text.includes(want)) {
    const left = ms - (Date.now() - started);
    if (left <= 0) throw new Error(`"${want}" not read within ${ms} ms; got ${JSON.stringify(got.text)}`);
    const next = await Promise.race([reader.read(), new Promise<"timeout">((r) => setTimeout(() => r("timeout"), left))]);
    if (next === "timeout") continue;
    if (next.done) throw new Error(`stream ended before "${want}"; got ${JSON.stringify(got.text)}`);
    got.text += decoder.decode(next.value, { stream: true });
  }
  return Date.now() - started;
}

const lines = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => `line ${from + i}\n`).join("");

describe("rotateLog (drivers/common/vm-process.ts)", () => {
  it("moves the log to <log>.1 and empties it in place: a writer holding it open in append mode goes on at its start", () => {
    const w = appender(log);
    w.write(lines(1, 3));
    expect(rotateLog(log)).toBe("rotated");
    expect(readFileSync(`${log}.1`, "utf8")).toBe(lines(1, 3));
    expect(statSync(log).size).toBe(0);
    w.write("line 4\n");
    expect(readFileSync(log, "utf8")).toBe("line 4\n"); // no hole of zeros where the old content was
    expect(rotateLog(log)).toBe("rotated");
    expect(readFileSync(`${log}.1`, "utf8")).toBe("line 4\n"); // one older generation only
    expect(existsSync(`${log}.1.tmp`)).toBe(false);
    w.close();
  });

  it("at a process start, a log past LOG_MAX_BYTES is rotated, not lost; a smaller one is left as it is", () => {
    writeFileSync(log, `${"x".repeat(LOG_MAX_BYTES)}\nthe last run's last words\n`);
    capLog(log);
    expect(statSync(log).size).toBe(0);
    expect(readFileSync(`${log}.1`, "utf8").endsWith("the last run's last words\n")).toBe(true);
    writeFileSync(log, "small\n");
    capLog(log);
    expect(readFileSync(log, "utf8")).toBe("small\n");
  });
});

describe("the rotation rule", () => {
  /** A filesystem of sizes: what rotation would do, without a disk. */
  function fakeFs(sizes: Record<string, number>): LogFs & { rotated: string[] } {
    const rotated: string[] = [];
    return {
      rotated,
      size: (p) => sizes[p],
      rotate(p) {
        rotated.push(p);
        sizes[p] = 0;
        return "rotated";
      },
    };
  }

  it("rotates a log only once it is past the limit", () => {
    const fs = fakeFs({ a: 100, b: 101 });
    expect(rotateIfPast(fs, "a", 100)).toBeUndefined();
    expect(rotateIfPast(fs, "b", 100)).toBe("rotated");
    expect(rotateIfPast(fs, "missing", 100)).toBeUndefined();
    expect(fs.rotated).toEqual(["b"]);
  });

  it("looks at the awake agents' logs once per interval on the injected clock, and no more once stopped", () => {
    const clock = new ManualClock();
    const sizes: Record<string, number> = { awake: 50, big: 5000 };
    const fs = fakeFs(sizes);
    let paths = ["awake", "big"];
    const rotator = new LogRotator({ clock, log: silentLogger, limits: { maxBytes: 1000, rotateIntervalMs: 2000 }, fs, paths: () => paths });
    rotator.start();
    clock.advance(1999);
    expect(fs.rotated).toEqual([]);
    clock.advance(1);
    expect(fs.rotated).toEqual(["big"]);
    sizes.awake = 1001; // grew meanwhile
    clock.advance(2000);
    expect(fs.rotated).toEqual(["big", "awake"]);
    paths = []; // hibernated: nothing writes, nothing is looked at
    sizes.big = 9999;
    clock.advance(2000);
    expect(fs.rotated).toEqual(["big", "awake"]);
    paths = ["big"];
    rotator.stop();
    clock.advance(10_000);
    expect(fs.rotated).toEqual(["big", "awake"]);
  });

  it("a rotation that fails is told about and tried again on the next pass", () => {
    const clock = new ManualClock();
    const warnings: string[] = [];
    const log = { ...silentLogger, warn: (m: string) => void warnings.push(m) };
    let fail = true;
    const fs: LogFs = {
      size: () => 2000,
      rotate() {
        if (fail) throw new Error("EACCES");
        return "rotated";
      },
    };
    const rotator = new LogRotator({ clock, log, limits: { maxBytes: 1000, rotateIntervalMs: 100 }, fs, paths: () => ["x"] });
    expect(rotator.pass()).toEqual([]);
    expect(warnings).toEqual(["agent log rotation failed"]);
    fail = false;
    expect(rotator.pass()).toEqual(["x"]);
  });
});

describe("the tail", () => {
  it("reads the last bytes across <log>.1 and <log>, from the start of the line it cut", async () => {
    const w = appender(log);
    w.write(lines(1, 5));
    rotateLog(log);
    w.write(lines(6, 8));
    const all = lines(1, 8);
    // 20 bytes before the current file's start fall inside "line 4\n" (cut) → the tail starts at "line 5".
    const cur = lines(6, 8).length;
    expect(await readAll(openLogStream(log, { tailBytes: cur + 10, follow: false }))).toBe(lines(5, 8));
    expect(await readAll(openLogStream(log, { tailBytes: 10 ** 9, follow: false }))).toBe(all);
    expect(await readAll(openLogStream(log, { tailBytes: 0, follow: false }))).toBe("");
    w.close();
  });

  it("keeps a whole line when the cut falls right after a newline, also at the boundary between the two files", async () => {
    writeFileSync(log, lines(1, 3));
    expect(await readAll(openLogStream(log, { tailBytes: lines(2, 3).length, follow: false }))).toBe(lines(2, 3));
    rotateLog(log);
    writeFileSync(log, lines(4, 4));
    expect(await readAll(openLogStream(log, { tailBytes: lines(4, 4).length, follow: false }))).toBe(lines(4, 4));
    expect(await readAll(openLogStream(log, { tailBytes: lines(4, 4).length + 3, follow: false }))).toBe(lines(4, 4));
  });

  it("a line longer than the search window is shown from where it was cut; a missing log reads as empty", async () => {
    writeFileSync(log, "y".repeat(200_000));
    expect((await readAll(openLogStream(log, { tailBytes: 100_000, follow: false }))).length).toBe(100_000);
    expect(await readAll(openLogStream(join(dir, "none.log"), { tailBytes: 1000, follow: false }))).toBe("");
  });

  it("comes in chunks of at most chunkBytes", async () => {
    writeFileSync(log, "z".repeat(10_000));
    const reader = openLogStream(log, { tailBytes: 10_000, follow: false, chunkBytes: 4096 }).getReader();
    const sizes: number[] = [];
    for (;;) {
      const next = await reader.read();
      if (next.done) break;
      sizes.push(next.value.length);
    }
    expect(sizes).toEqual([4096, 4096, 1808]);
  });
});

describe("a follow", () => {
  it("yields the tail, then bytes as they are appended", async () => {
    const w = appender(log);
    w.write(lines(1, 2));
    const reader = openLogStream(log, { tailBytes: 1000, follow: true, pollMs: 20 }).getReader();
    const got = { text: "" };
    await readUntil(reader, got, "line 2\n");
    w.write("line 3\n");
    const ms = await readUntil(reader, got, "line 3\n");
    expect(ms).toBeLessThan(1000);
    expect(got.text).toBe(lines(1, 3));
    await reader.cancel();
    w.close();
  });

  it("goes on after a truncation in place, from the log's new start", async () => {
    const w = appender(log);
    w.write("before the truncate\n");
    const reader = openLogStream(log, { tailBytes: 0, follow: true, pollMs: 20 }).getReader();
    const got = { text: "" };
    w.write("one\n");
    await readUntil(reader, got, "one\n");
    truncateSync(log, 0);
    await new Promise((r) => setTimeout(r, 60)); // the follow sees it shorter than what it read
    w.write("two\n");
    await readUntil(reader, got, "two\n");
    expect(got.text).toBe("one\ntwo\n");
    await reader.cancel();
    w.close();
  });

  it("goes on through a rotation: what it had not read yet comes from <log>.1, once, then the new output", async () => {
    const w = appender(log);
    const reader = openLogStream(log, { tailBytes: 0, follow: true, pollMs: 20 }).getReader();
    const got = { text: "" };
    w.write("a1\n");
    await readUntil(reader, got, "a1\n");
    w.write("a2\n"); // not read before the rotation
    rotateLog(log);
    w.write("b1\n");
    await readUntil(reader, got, "b1\n");
    w.write("b2\n");
    rotateLog(log); // a rotation of bytes it had not read at all, right after one it had
    w.write("c1\n");
    await readUntil(reader, got, "c1\n");
    expect(got.text).toBe("a1\na2\nb1\nb2\nc1\n");
    await reader.cancel();
    w.close();
  });

  it("waits for a log that does not exist yet (an agent that never ran: nothing wakes it)", async () => {
    const reader = openLogStream(log, { tailBytes: 1000, follow: true, pollMs: 20 }).getReader();
    const got = { text: "" };
    const pending = readUntil(reader, got, "first boot\n");
    await new Promise((r) => setTimeout(r, 100));
    writeFileSync(log, "first boot\n");
    await pending;
    expect(got.text).toBe("first boot\n");
    await reader.cancel();
  });

  it("ends when the consumer cancels, when the signal aborts, and when the agent is gone", async () => {
    writeFileSync(log, "x\n");
    const cancelled = openLogStream(log, { tailBytes: 0, follow: true, pollMs: 20 }).getReader();
    const waiting = cancelled.read();
    await cancelled.cancel();
    expect((await waiting).done).toBe(true);

    const abort = new AbortController();
    const aborted = openLogStream(log, { tailBytes: 0, follow: true, pollMs: 10_000, signal: abort.signal }).getReader();
    const started = Date.now();
    const read = aborted.read();
    setTimeout(() => abort.abort(), 50);
    expect((await read).done).toBe(true);
    expect(Date.now() - started).toBeLessThan(1000); // not at the next poll, 10 s later

    let gone = false;
    const deleted = openLogStream(log, { tailBytes: 10, follow: true, pollMs: 20, gone: () => gone }).getReader();
    expect(new TextDecoder().decode((await deleted.read()).value)).toBe("x\n");
    const last = deleted.read();
    gone = true;
    expect((await last).done).toBe(true);
  });

  it("an already aborted signal reads nothing", async () => {
    writeFileSync(log, "x\n");
    const abort = new AbortController();
    abort.abort();
    expect(await readAll(openLogStream(log, { tailBytes: 100, follow: true, signal: abort.signal }))).toBe("");
  });
});

describe("the gateway's framing (gateway/logs/routes.ts)", () => {
  const source = (chunks: string[]) => {
    const encoder = new TextEncoder();
    return new ReadableStream<Uint8Array>({
      start(c) {
        for (const chunk of chunks) c.enqueue(encoder.encode(chunk));
        c.close();
      },
    });
  };

  it("one event per line, whatever ends it (LF, CRLF, CR), also when a chunk splits a CRLF or a UTF-8 character", async () => {
    const euro = new TextEncoder().encode("€"); // 3 bytes, split across two chunks below
    const parts = [
      new TextEncoder().encode("a\r"),
      new TextEncoder().encode("\nb\rc"),
      new Uint8Array([...new TextEncoder().encode("\n"), euro[0]!]),
      new Uint8Array([euro[1]!, euro[2]!, 0x0a]),
      new TextEncoder().encode("\n: not a comment\npartial"),
    ];
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        for (const p of parts) c.enqueue(p);
        c.close();
      },
    });
    expect(await new Response(logEventStream(stream, 0)).text()).toBe(
      "data: a\n\ndata: b\n\ndata: c\n\ndata: €\n\ndata: \n\ndata: : not a comment\n\ndata: partial\n\n",
    );
  });

  it("a follow's quiet stream carries keepalive comments; cancelling it cancels the source", async () => {
    let cancelled = false;
    const quiet = new ReadableStream<Uint8Array>({ cancel: () => void (cancelled = true) });
    const reader = logEventStream(quiet, 20).getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toBe(": keepalive\n\n");
    await reader.cancel();
    expect(cancelled).toBe(true);
    expect(await new Response(logEventStream(source(["x\n"]), 0)).text()).toBe("data: x\n\n");
  });

  it("tail is a number of bytes, follow true or false; anything else is a 400", () => {
    expect(parseTail(undefined)).toBe(defaultLogTailBytes);
    expect(parseTail("0")).toBe(0);
    expect(parseTail(String(maxLogTailBytes))).toBe(maxLogTailBytes);
    for (const bad of ["abc", "-1", "1e3", "1.5", " 1", String(maxLogTailBytes + 1), "99999999999"]) expect(() => parseTail(bad), bad).toThrow(/tail must be/);
    expect([parseFollow(undefined), parseFollow("false"), parseFollow("0"), parseFollow("true"), parseFollow("1")]).toEqual([false, false, false, true, true]);
    expect(() => parseFollow("yes")).toThrow(/follow must be/);
  });
});
