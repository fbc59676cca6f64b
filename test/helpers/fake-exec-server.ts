// A small Node fake of the exec server's wire protocol v1 (fleet-agent/guest/guest-exec/), for unit tests of the gateway's exec and files routes only.
//
// Commands are not run: a few argv[0]s stand for behaviours (`echo`, `cat` (stdin), `big N`, `exit N`, `killed N`,
// `timeout`, `nosuch`, `cut` (a stream without an exit), `utf8split`, `sleep MS`, `linger MS` (the exit, then the
// answer's end MS later)). Files live in a real directory (`root`).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, chmodSync, createReadStream } from "node:fs";
import { dirname, join } from "node:path";
import type { AddressInfo } from "node:net";
import { decodeSpec, encodeFrame, frameType } from "../../contracts/exec-wire.ts";

export interface FakeExecServer {
  url: string;
  port: number;
  key: string;
  /** Every request's method, path and spec strings (exec). */
  seen: { method: string; path: string; spec?: string[]; key?: string }[];
  close(): Promise<void>;
}

const enc = new TextEncoder();

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of req) parts.push(chunk as Buffer);
  return Buffer.concat(parts);
}

export async function startFakeExecServer(root: string, key = "k".repeat(64)): Promise<FakeExecServer> {
  const seen: FakeExecServer["seen"] = [];
  let nextPid = 100;
  const procs = new Map<
    number,
    { pid: number; cmd: string[]; state: string; exitCode: number | null; signal: number | null; startedAtMs: number; endedAtMs: number | null; stdout: Buffer }
  >();

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://x");
    const entry: FakeExecServer["seen"][number] = { method: req.method ?? "", path: url.pathname + url.search };
    const sentKey = req.headers["x-agentvm-exec-key"];
    if (typeof sentKey === "string") entry.key = sentKey;
    seen.push(entry);
    res.setHeader("connection", "close");
    if (sentKey !== key) return text(res, 401, "bad key");
    const p = url.pathname;
    const path = url.searchParams.get("path");
    if (path !== null && (!path.startsWith("/") || path.split("/").includes(".."))) return text(res, 400, "path must be absolute, without ..");
    if (p === "/v1/exec" && req.method === "POST") {
      const { spec, rest } = decodeSpec(new Uint8Array(await readBody(req)));
      entry.spec = spec;
      const argv = spec.filter((s) => s.startsWith("arg=")).map((s) => s.slice(4));
      if (spec.includes("background=1")) {
        const pid = nextPid++;
        procs.set(pid, {
          pid,
          cmd: argv,
          state: "running",
          exitCode: null,
          signal: null,
          startedAtMs: Date.now(),
          endedAtMs: null,
          stdout: Buffer.from("bg out\n"),
        });
        res.writeHead(201, { "content-type": "application/json" });
        return res.end(JSON.stringify({ pid }));
      }
      res.writeHead(200, { "content-type": "application/vnd.agentvm.exec-frames" });
      const frame = (type: number, s: string | Uint8Array) => res.write(encodeFrame(type, typeof s === "string" ? enc.encode(s) : s));
      const exit = (s: string) => {
        frame(frameType.exit, s);
        res.end();
      };
      switch (argv[0]) {
        case "echo":
          frame(frameType.stdout, `${argv.slice(1).join(" ")}\n`);
          return exit("code=0 ms=3");
        case "cat":
          frame(frameType.stdout, rest);
          return exit("code=0 ms=1");
        case "big": {
          const n = Number(argv[1]);
          const chunk = new Uint8Array(65536).fill(97);
          let sent = 0;
          const pump = () => {
            while (sent < n) {
              const m = Math.min(chunk.byteLength, n - sent);
              sent += m;
              // One frame written in two pieces, so the decoder meets cut frames.
              const bytes = encodeFrame(frameType.stdout, chunk.subarray(0, m));
              res.write(bytes.subarray(0, 3));
              if (!res.write(bytes.subarray(3))) return void res.once("drain", pump);
            }
            frame(frameType.stderr, "done\n");
            exit("code=0 ms=10");
          };
          return pump();
        }
        case "exit":
          frame(frameType.stderr, "bye\n");
          return exit(`code=${argv[1]} ms=2`);
        case "killed":
          return exit(`signal=${argv[1]} ms=5`);
        case "timeout":
          return exit("signal=9 timeout=1 ms=100");
        case "nosuch":
          frame(frameType.error, "not found: nosuch");
          return exit("code=127 ms=0");
        case "cut":
          frame(frameType.stdout, "partial");
          return res.end();
        case "sleep": {
          // Runs for argv[1] ms (its answer's head and a first line at once), or until the caller goes away.
          frame(frameType.stdout, "sleeping\n");
          const timer = setTimeout(() => exit("code=0 ms=1"), Number(argv[1]));
          res.once("close", () => clearTimeout(timer));
          return;
        }
        case "linger":
          // The exit frame at once, the end of the answer argv[1] ms later (a connection closed late).
          frame(frameType.stdout, "done\n");
          frame(frameType.exit, "code=0 ms=1");
          setTimeout(() => res.end(), Number(argv[1]));
          return;
        case "utf8split": {
          const e = enc.encode("é€");
          frame(frameType.stdout, e.subarray(0, 1));
          frame(frameType.stdout, e.subarray(1));
          return exit("code=0 ms=1");
        }
        default:
          frame(frameType.stdout, argv.join(" "));
          return exit("code=0 ms=1");
      }
    }
    const proc = /^\/v1\/procs\/(\d+)(\/.*)?$/.exec(p);
    if (p === "/v1/procs") return jsonOut(res, 200, { processes: [...procs.values()].map(({ stdout, ...v }) => v) });
    if (proc) {
      const pr = procs.get(Number(proc[1]));
      if (!pr) return text(res, 404, "no such process");
      const { stdout, ...view } = pr;
      const sub = proc[2] ?? "";
      if (sub === "") return jsonOut(res, 200, view);
      if (sub === "/wait") return jsonOut(res, 200, view);
      if (sub === "/stdin") {
        await readBody(req);
        res.writeHead(204);
        return res.end();
      }
      if (sub === "/signal") {
        pr.state = "exited";
        pr.signal = Number(url.searchParams.get("sig"));
        pr.endedAtMs = Date.now();
        res.writeHead(204);
        return res.end();
      }
      if (sub === "/output") {
        const offset = Number(url.searchParams.get("offset") ?? 0);
        const limit = Number(url.searchParams.get("limit") ?? 65536);
        const piece = stdout.subarray(offset, offset + limit);
        res.writeHead(200, { "x-next-offset": String(offset + piece.byteLength), "x-dropped": "0", ...(pr.state === "exited" ? { "x-eof": "1" } : {}) });
        return res.end(piece);
      }
    }
    if (p === "/v1/files" || p === "/v1/tar") {
      if (path === null) return text(res, 400, "path missing");
      if (path.startsWith("/proc")) return text(res, 403, `refused: ${path}`);
      const real = join(root, path);
      if (req.method === "GET") {
        let st;
        try {
          st = statSync(real);
        } catch {
          return text(res, 404, `not found: ${path}`);
        }
        if (p === "/v1/tar") {
          res.writeHead(200, { "content-type": "application/x-tar" });
          return res.end(readFileSync(real));
        }
        if (st.isDirectory()) {
          const entries = readdirSync(real).map((name) => {
            const s = statSync(join(real, name));
            return {
              name,
              type: s.isDirectory() ? "dir" : "file",
              size: s.size,
              mode: s.mode & 0o7777,
              uid: s.uid,
              gid: s.gid,
              mtimeMs: Math.floor(s.mtimeMs),
            };
          });
          return jsonOut(res, 200, { entries });
        }
        res.writeHead(200, {
          "content-length": String(st.size),
          "x-file-mode": (st.mode & 0o7777).toString(8),
          "x-file-uid": String(st.uid),
          "x-file-gid": String(st.gid),
          "x-file-mtime-ms": String(Math.floor(st.mtimeMs)),
        });
        return createReadStream(real).pipe(res);
      }
      if (req.method === "PUT") {
        const body = await readBody(req);
        if (p === "/v1/tar") {
          mkdirSync(real, { recursive: true });
          writeFileSync(join(real, "tar.bin"), body);
          return jsonOut(res, 201, { entries: 3 });
        }
        if (url.searchParams.get("mkdirs") === "1") mkdirSync(dirname(real), { recursive: true });
        try {
          writeFileSync(real, body);
        } catch {
          return text(res, 404, `no directory for ${path}`);
        }
        const mode = url.searchParams.get("mode");
        if (mode) chmodSync(real, Number.parseInt(mode, 8));
        const st = statSync(real);
        return jsonOut(res, 201, { size: st.size, mode: st.mode & 0o7777, uid: st.uid, gid: st.gid });
      }
      if (req.method === "DELETE") {
        try {
          statSync(real);
        } catch {
          return text(res, 404, `not found: ${path}`);
        }
        rmSync(real, { recursive: url.searchParams.get("recursive") === "1" });
        res.writeHead(204);
        return res.end();
      }
    }
    return text(res, 404, "no such route");
  };

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (!res.headersSent) text(res, 500, String(err));
      else res.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    key,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function text(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { "content-type": "text/plain" });
  res.end(body);
}

function jsonOut(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}
