// The desktop base's `call` (images/desktop/call.c) compiled here and run against a fake X server and a fake resident helper: its PNG, its scaling, the helper's protocol, its refusals; and the base's key following its source.
import { spawn, spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type BaseSpec, bases, imageKey } from "../../images/build/base.ts";
import { decodePng } from "../helpers/png.ts";

const gcc = spawnSync("gcc", ["--version"]).status === 0;
// npm test provisions gcc (the guest image is built with it): in CI a missing one fails instead of skipping.
if (!gcc && process.env.CI === "true") throw new Error("CI: gcc missing (npm test provisions it: scripts/provision.ts)");
if (!gcc) console.log("desktop-call.test.ts skipped: no gcc (npm run setup:vm installs it)");
const source = join(import.meta.dirname, "..", "..", "images", "desktop", "call.c");
const W = 200;
const H = 50;
let dir: string;
let bin: string;
let xServer: Server;
let display: string;
let requests: number[] = [];

/** The test screen as 0x00RRGGBB words: flat colour, vertical stripes (rows repeat), runs past 86 pixels, and noise. */
function pixel(x: number, y: number): number {
  if (y < 10) return 0x336699;
  if (y < 25) return x % 7 < 3 ? 0xffffff : 0x000000;
  if (y < 35) return (x * 2654435761 + y * 40503) & 0xffffff;
  return x < 150 ? 0xfafafa : (x + y) % 2 ? 0x010203 : 0x030201;
}

/** A fake X server on a unix socket: the setup (depth 24, 32 bits a pixel, 0xRRGGBB), no MIT-SHM, GetImage of the screen above. */
function fakeX(path: string): Server {
  const server = createServer((sock: Socket) => {
    let buf = Buffer.alloc(0);
    let setup = false;
    let seq = 0;
    sock.on("data", (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      if (!setup) {
        if (buf.length < 12) return;
        buf = buf.subarray(12);
        setup = true;
        const vendor = Buffer.from("fake");
        const extra = Buffer.alloc(32 + 4 + 8 + 40 + 8 + 24);
        extra.writeUInt32LE(0x00400000, 4); // resource id base
        extra.writeUInt16LE(vendor.length, 16);
        extra[20] = 1; // screens
        extra[21] = 1; // formats
        extra[26] = 8;
        extra[27] = 255;
        vendor.copy(extra, 32);
        let at = 36;
        extra[at] = 24; // format: depth 24, 32 bits a pixel
        extra[at + 1] = 32;
        at += 8;
        extra.writeUInt32LE(0x100, at); // root window
        extra.writeUInt16LE(W, at + 20);
        extra.writeUInt16LE(H, at + 22);
        extra.writeUInt32LE(0x21, at + 32); // root visual
        extra[at + 38] = 24;
        extra[at + 39] = 1; // depths
        at += 40;
        extra[at] = 24;
        extra.writeUInt16LE(1, at + 2);
        at += 8;
        extra.writeUInt32LE(0x21, at);
        extra[at + 4] = 4; // TrueColor
        extra.writeUInt32LE(0xff0000, at + 8);
        extra.writeUInt32LE(0xff00, at + 12);
        extra.writeUInt32LE(0xff, at + 16);
        const head = Buffer.from([1, 0, 11, 0, 0, 0, 0, 0]);
        head.writeUInt16LE(extra.length / 4, 6);
        sock.write(Buffer.concat([head, extra]));
      }
      while (buf.length >= 4 && buf.length >= buf.readUInt16LE(2) * 4) {
        const op = buf[0]!;
        const len = buf.readUInt16LE(2) * 4;
        buf = buf.subarray(len);
        seq++;
        requests.push(op);
        const reply = Buffer.alloc(32);
        reply[0] = 1;
        reply.writeUInt16LE(seq, 2);
        if (op === 98) {
          sock.write(reply); // QueryExtension: not present
        } else if (op === 73) {
          reply[1] = 24;
          reply.writeUInt32LE(W * H, 4);
          const px = Buffer.alloc(W * H * 4);
          // The pad byte is not zero (as a server may leave it): the PNG must not depend on it.
          for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) px.writeUInt32LE((pixel(x, y) | ((x * 31) << 24)) >>> 0, (y * W + x) * 4);
          sock.write(Buffer.concat([reply, px]));
        } else {
          const error = Buffer.alloc(32);
          error[1] = 1; // BadRequest
          error.writeUInt16LE(seq, 2);
          sock.write(error);
        }
      }
    });
  });
  server.listen(path);
  return server;
}

/** The PNG `call` wrote (8-bit RGB; test/helpers/png.ts checks its chunks and the Adler-32): its size and 0xRRGGBB pixels. */
function decode(png: Buffer): { w: number; h: number; px: number[] } {
  const p = decodePng(png);
  expect(p.channels).toBe(3);
  const px: number[] = [];
  for (let i = 0; i < p.data.length; i += 3) px.push((p.data[i]! << 16) | (p.data[i + 1]! << 8) | p.data[i + 2]!);
  return { w: p.width, h: p.height, px };
}

/** Runs `call` with `stdin` (not spawnSync: the fake servers answering it run in this process). */
function run(stdin: string, env: Record<string, string> = {}): Promise<{ status: number | null; stdout: Buffer; stderr: Buffer }> {
  const child = spawn(bin, [], { env: { DISPLAY: display, ...env } });
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout.on("data", (d: Buffer) => out.push(d));
  child.stderr.on("data", (d: Buffer) => err.push(d));
  child.stdin.end(stdin);
  return new Promise((resolve) => child.on("close", (status) => resolve({ status, stdout: Buffer.concat(out), stderr: Buffer.concat(err) })));
}

/** The nearest-pixel picture `call` should give at `sw` x `sh` (the centre of each target pixel, as the Python helper). */
function expected(sw: number, sh: number): number[] {
  const out: number[] = [];
  for (let y = 0; y < sh; y++)
    for (let x = 0; x < sw; x++) out.push(pixel(Math.min(W - 1, Math.floor(((x + 0.5) * W) / sw)), Math.min(H - 1, Math.floor(((y + 0.5) * H) / sh))));
  return out;
}

/** A fake resident helper answering every request with `answer`; the requests it got. */
async function fakeHelper(answer: string): Promise<{ port: number; got: string[]; server: Server }> {
  const got: string[] = [];
  const server = createServer((sock) => {
    let line = "";
    sock.on("data", (d) => {
      line += d.toString();
      if (line.includes("\n")) {
        got.push(line.trim());
        sock.end(answer);
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { port: (server.address() as { port: number }).port, got, server };
}

describe.skipIf(!gcc)("the desktop base's call program", () => {
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "desktop-call-"));
    bin = join(dir, "call");
    const built = spawnSync("gcc", ["-static", "-O2", "-Wall", "-Werror", "-o", bin, source, "-lm"], { encoding: "utf8" });
    expect(built.status, built.stderr).toBe(0);
    xServer = fakeX(join(dir, "X"));
    display = `${join(dir, "X")}:0`;
  });

  afterAll(() => {
    xServer?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("answers a screenshot as an RGB PNG of the screen's very pixels, by GetImage when the server has no MIT-SHM", async () => {
    requests = [];
    const r = await run('{"cmd":"screenshot"}\n');
    expect(r.status, r.stderr.toString()).toBe(0);
    const png = decode(r.stdout);
    expect([png.w, png.h]).toEqual([W, H]);
    expect(png.px).toEqual(expected(W, H));
    expect(requests).toEqual([98, 73]); // QueryExtension MIT-SHM, GetImage
    // Runs and repeated rows compress: far below the 30 KB of raw pixels (the noise band alone is 6 KB of them).
    expect(r.stdout.length).toBeLessThan(12_000);
  });

  it("scales to the nearest pixel (sizes rounded as the Python helper did)", async () => {
    for (const [scale, sw, sh] of [
      [0.5, 100, 25],
      [0.37, 74, 18],
      [0.05, 10, 2],
    ] as const) {
      const r = await run(JSON.stringify({ cmd: "screenshot", scale }));
      expect(r.status, r.stderr.toString()).toBe(0);
      const png = decode(r.stdout);
      expect([png.w, png.h]).toEqual([sw, sh]);
      expect(png.px).toEqual(expected(sw, sh));
    }
  });

  it("refuses a scale out of 0.05..1 (exit 2) before reaching the display", async () => {
    requests = [];
    const r = await run('{"cmd":"screenshot","scale":2}');
    expect(r.status).toBe(2);
    expect(r.stderr.toString()).toBe("refused: scale must be within 0.05..1\n");
    expect(requests).toEqual([]);
  });

  it("hands actions to the resident helper, marked, and adds the screenshot itself when the helper answers `shot`", async () => {
    const helper = await fakeHelper('shot 0.5\n{"cursor": {"x": 3, "y": 4}}');
    try {
      const request = JSON.stringify({ cmd: "actions", actions: [{ type: "move", x: 3, y: 4 }], screenshot: true, scale: 0.5 });
      const r = await run(`${request}\n`, { AGENTVM_DESKTOP_HELPER_PORT: String(helper.port) });
      expect(r.status, r.stderr.toString()).toBe(0);
      expect(helper.got).toEqual([`{"screenshotBy":"call",${request.slice(1)}`]);
      const out = JSON.parse(r.stdout.toString()) as { cursor: unknown; screenshot: string };
      expect(out.cursor).toEqual({ x: 3, y: 4 });
      const png = decode(Buffer.from(out.screenshot, "base64"));
      expect([png.w, png.h]).toEqual([100, 25]);
      expect(png.px).toEqual(expected(100, 25));
    } finally {
      helper.server.close();
    }
  });

  it("passes the helper's own answers and refusals through (exit 2 with its reason)", async () => {
    const ok = await fakeHelper('ok\n{"width": 200, "height": 50}');
    const refused = await fakeHelper("refused: actions[0]: unknown type 'teleport'\n");
    try {
      const a = await run('{"cmd":"size"}\n', { AGENTVM_DESKTOP_HELPER_PORT: String(ok.port) });
      expect([a.status, a.stdout.toString()]).toEqual([0, '{"width": 200, "height": 50}']);
      expect(ok.got).toEqual(['{"cmd":"size"}']); // not an actions request: not marked
      const b = await run('{"cmd":"actions","actions":[{"type":"teleport"}]}\n', { AGENTVM_DESKTOP_HELPER_PORT: String(refused.port) });
      expect(b.status).toBe(2);
      expect(b.stderr.toString()).toBe("refused: actions[0]: unknown type 'teleport'\n");
    } finally {
      ok.server.close();
      refused.server.close();
    }
  });
});

describe("the desktop base's key", () => {
  it("follows call.c's source: changing it recommits the base", () => {
    const desktop = bases.find((b) => b.repo === "agentvm/desktop")!;
    const call = desktop.files!.find((f) => f.path === "/usr/lib/agentvm/desktop/call")!;
    expect(call.compile).toBeDefined();
    const tmp = mkdtempSync(join(tmpdir(), "desktop-key-"));
    try {
      const copy = join(tmp, "call.c");
      copyFileSync(call.source, copy);
      const spec: BaseSpec = { ...desktop, files: desktop.files!.map((f) => (f === call ? { ...f, source: copy } : f)) };
      const before = imageKey(spec, "0".repeat(32));
      expect(imageKey(spec, "0".repeat(32))).toBe(before);
      writeFileSync(copy, "// changed\n", { flag: "a" });
      expect(imageKey(spec, "0".repeat(32))).not.toBe(before);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});
