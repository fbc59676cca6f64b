// 200 MB up and 200 MB down through the gateway run as `npm start` runs it (its own process), with that process's
// memory watched: bodies stream with backpressure both ways, so its resident memory must stay flat.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freshDatabase } from "../helpers/db.ts";

const MiB = 1024 * 1024;
const size = 200 * MiB;
// Bytes that may be in flight between the two ends while one of them does not read: socket buffers' worth.
const inFlight = 64 * MiB;
// What the gateway's resident size may grow by while a body streams through it. Not near zero: V8 frees the
// Buffers a stream has passed on only at a GC, which it forces once ~64 MB of them are outstanding (its external
// memory limit), and malloc keeps some of what it got back; measured 0-46 MB on a quiet machine, 73 MB once in CI.
// A gateway that buffered the body would hold all of it at once: 196-200 MB of growth, tried by holding the
// chunks in the Node fast path until the body's end.
const growthBound = size / 2;

let child: ChildProcess;
let dataDir: string;
let base = "";
let token = "";
let closeDb: () => Promise<void>;

beforeAll(async () => {
  const db = await freshDatabase();
  closeDb = () => db.close();
  dataDir = mkdtempSync(join(tmpdir(), "agentvm-mem-"));
  const start = fileURLToPath(new URL("../../scripts/start.ts", import.meta.url));
  child = spawn(process.execPath, [start], {
    env: { ...process.env, PORT: "0", DATA_DIR: dataDir, DATABASE_URL: db.url, DRIVER: "process", LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`npm start did not come up: ${out}`)), 60_000);
    child.stdout!.on("data", (c: Buffer) => {
      out += c.toString();
      const url = /gateway\s+(http:\/\/\S+)/.exec(out);
      const tok = /token\s+(\S+)/.exec(out);
      if (url && tok) {
        clearTimeout(timer);
        base = url[1]!;
        token = tok[1]!;
        resolve();
      }
    });
    child.stderr!.on("data", (c: Buffer) => (out += c.toString()));
    child.once("exit", (code) => reject(new Error(`npm start exited with ${code}: ${out}`)));
  });
});

afterAll(async () => {
  if (child && child.exitCode === null) {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
  }
  await closeDb?.();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** Resident and peak resident memory of the gateway process, bytes (Linux /proc). */
/** Bytes the demo agent's /bytes endpoint has handed to its connections so far. */
async function bytesSent(): Promise<number> {
  const res = await fetch(`${base}/a/agt_demo/stats`, { headers: { authorization: `Bearer ${token}` } });
  return ((await res.json()) as { bytesSent: number }).bytesSent;
}

function memory(): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${child.pid}/status`, "utf8");
  const kb = (field: string) => Number(new RegExp(`${field}:\\s+(\\d+) kB`).exec(status)?.[1] ?? 0) * 1024;
  return { rss: kb("VmRSS"), peak: kb("VmHWM") };
}

/** Resets the peak (VmHWM) to the current resident size, so the next peak is this transfer's. */
function resetPeak(): boolean {
  try {
    writeFileSync(`/proc/${child.pid}/clear_refs`, "5");
    return true;
  } catch {
    return false;
  }
}

/** Measures the gateway's memory across `transfer`: the highest resident size minus the size before. */
async function growthDuring(transfer: () => Promise<void>): Promise<number> {
  const before = memory().rss;
  const peakReset = resetPeak();
  let sampled = before;
  const sampler = setInterval(() => (sampled = Math.max(sampled, memory().rss)), 20);
  try {
    await transfer();
  } finally {
    clearInterval(sampler);
  }
  const peak = peakReset ? Math.max(memory().peak, sampled) : sampled;
  return peak - before;
}

/** Uploads `bytes` (a checksummed pattern) as fast as the connection takes them; `progress.written` counts what was handed over. */
function upload(bytes: number, query = "", progress = { written: 0 }): Promise<{ status: number; body: { bytes: number; sha256: string }; sha256: string }> {
  return new Promise((resolve, reject) => {
    const hash = createHash("sha256");
    const req = request(
      `${base}/a/agt_demo/upload${query}`,
      { method: "POST", headers: { authorization: `Bearer ${token}`, "content-length": bytes } },
      (res) => {
        let text = "";
        res.on("data", (c: Buffer) => (text += c.toString()));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as { bytes: number; sha256: string }, sha256: hash.digest("hex") }));
      },
    );
    req.on("error", reject);
    const block = Buffer.alloc(256 * 1024);
    let left = bytes;
    let n = 0;
    const pump = () => {
      while (left > 0) {
        block.fill(n++ & 0xff);
        const piece = left >= block.length ? block : block.subarray(0, left);
        left -= piece.length;
        hash.update(piece);
        progress.written += piece.length;
        if (!req.write(Buffer.from(piece))) return void req.once("drain", pump);
      }
      req.end();
    };
    pump();
  });
}

/** Downloads `bytes`; with `pauseMs` the client stops reading for that long after the first chunk. */
function download(bytes: number, pauseMs = 0, progress = { received: 0 }): Promise<{ status: number; received: number }> {
  return new Promise((resolve, reject) => {
    const req = request(`${base}/a/agt_demo/bytes?size=${bytes}`, { headers: { authorization: `Bearer ${token}` } }, (res) => {
      let received = 0;
      res.on("data", (c: Buffer) => {
        if (received === 0 && pauseMs > 0) {
          res.pause();
          setTimeout(() => res.resume(), pauseMs);
        }
        received += c.length;
        progress.received = received;
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, received }));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("large bodies through the gateway process", () => {
  it(`a ${size / MiB} MB upload streams in constant memory and arrives intact`, async () => {
    // Warm up: the agent boots, and V8's young generation grows to its working size (up to ~50 MB by itself)
    // before the measurement (one transfer of the same size); buffering the body would show as growth near its size.
    expect((await upload(size)).status).toBe(200);
    let result: Awaited<ReturnType<typeof upload>> | undefined;
    const growth = await growthDuring(async () => {
      result = await upload(size);
    });
    expect(result!.status).toBe(200);
    expect(result!.body.bytes).toBe(size);
    expect(result!.body.sha256).toBe(result!.sha256);
    console.log(`upload ${size / MiB} MB: gateway RSS growth ${(growth / MiB).toFixed(1)} MB`);
    expect(growth).toBeLessThan(growthBound);
  });

  it("an upload to an agent that stops reading is held back at the client (backpressure), not buffered in the gateway", async () => {
    const progress = { written: 0 };
    let result: Awaited<ReturnType<typeof upload>> | undefined;
    let writtenDuringStall = 0;
    const growth = await growthDuring(async () => {
      const done = upload(size, "?stallMs=2000", progress);
      await new Promise((r) => setTimeout(r, 1500));
      writtenDuringStall = progress.written;
      result = await done;
    });
    expect(result!.body.bytes).toBe(size);
    expect(result!.body.sha256).toBe(result!.sha256);
    console.log(
      `upload to an agent stalled 2 s: client got ${(writtenDuringStall / MiB).toFixed(1)} MB out meanwhile; gateway RSS growth ${(growth / MiB).toFixed(1)} MB`,
    );
    // Only socket buffers' worth can leave the client while nothing reads at the far end.
    expect(writtenDuringStall).toBeLessThan(inFlight);
    expect(growth).toBeLessThan(growthBound);
  });

  it("a download to a client that stops reading is held back at the agent, not buffered in the gateway", async () => {
    const progress = { received: 0 };
    let result: { status: number; received: number } | undefined;
    let aheadDuringPause = 0;
    const growth = await growthDuring(async () => {
      const sentBefore = await bytesSent();
      const done = download(size, 2000, progress);
      await new Promise((r) => setTimeout(r, 1500));
      aheadDuringPause = (await bytesSent()) - sentBefore - progress.received;
      result = await done;
    });
    expect(result).toEqual({ status: 200, received: size });
    console.log(
      `download to a client paused 2 s: the agent got ${(aheadDuringPause / MiB).toFixed(1)} MB ahead of it meanwhile; gateway RSS growth ${(growth / MiB).toFixed(1)} MB`,
    );
    // Only socket buffers' worth can leave the agent while nothing reads at the far end.
    expect(aheadDuringPause).toBeLessThan(inFlight);
    expect(growth).toBeLessThan(growthBound);
  });

  it(`a ${size / MiB} MB download streams in constant memory and arrives whole`, async () => {
    expect((await download(size)).received).toBe(size);
    let result: { status: number; received: number } | undefined;
    const growth = await growthDuring(async () => {
      result = await download(size);
    });
    expect(result).toEqual({ status: 200, received: size });
    console.log(`download ${size / MiB} MB: gateway RSS growth ${(growth / MiB).toFixed(1)} MB`);
    expect(growth).toBeLessThan(growthBound);
  });
});
