// The egress proxy over real sockets, without a VM: CONNECT tunnels to an allowed address and bytes both ways,
// refusals (403 with the error envelope) for the host's own and special addresses, one resolution per request
// (DNS-rebinding safe), plain absolute-form HTTP, the per-VM connection bound, and the guestfwd relay binary.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { EgressProxy, parseAuthority, type ResolvedAddress } from "../../fleet-agent/egress/proxy.ts";
import { ensureEgressRelay } from "../../fleet-agent/egress/relay.ts";

const dir = mkdtempSync(join(tmpdir(), "egress-"));
const servers: (Server | HttpServer)[] = [];

function listen<T extends Server | HttpServer>(s: T, host = "127.0.0.1"): Promise<number> {
  servers.push(s);
  return new Promise((resolve) => s.listen(0, host, () => resolve((s.address() as AddressInfo).port)));
}

/** A TCP listener that answers every chunk with `echo:<chunk>`. */
const echoServer = () => listen(createServer((c) => c.on("data", (d) => c.write(`echo:${d.toString()}`))));

/** Sends `text` on a new connection to the unix socket and collects everything until the proxy closes or `until` shows up. */
function exchange(path: string, text: string, opts: { until?: RegExp; then?: string } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    let got = "";
    let sentThen = false;
    s.on("data", (d) => {
      got += d.toString();
      if (opts.then && !sentThen && got.includes("\r\n\r\n")) {
        sentThen = true;
        s.write(opts.then);
      }
      if (opts.until?.test(got)) {
        s.destroy();
        resolve(got);
      }
    });
    s.on("error", reject);
    s.on("close", () => resolve(got));
    s.write(text);
  });
}

const statusOf = (answer: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1]);
const bodyOf = (answer: string) => JSON.parse(answer.slice(answer.indexOf("\r\n\r\n") + 4)) as { error: { code: string; message: string; requestId: string } };

let allowedPort: number;
let otherPort: number;
let httpPort: number;
let proxy: EgressProxy;
let resolveCalls: string[];
let socketPath: string;
const seenByHttp: { url: string; host: string | undefined; proxyAuth: string | undefined }[] = [];

beforeAll(async () => {
  allowedPort = await echoServer();
  otherPort = await echoServer();
  httpPort = await listen(
    createHttpServer((req, res) => {
      seenByHttp.push({ url: req.url ?? "", host: req.headers.host, proxyAuth: req.headers["proxy-authorization"] });
      res.setHeader("x-upstream", "yes");
      res.end(`hello from ${req.url}`);
    }),
  );
  resolveCalls = [];
  // A resolver for the test's names: "rebind.test" first answers a refused address then the allowed one;
  // "inside.test" answers only the host's loopback; "both.test" a refused and an allowed address.
  const names: Record<string, ResolvedAddress[]> = {
    "inside.test": [{ address: "127.0.0.1", family: 4 }],
    "both.test": [
      { address: "10.9.9.9", family: 4 },
      { address: "127.0.0.1", family: 4 },
    ],
  };
  proxy = new EgressProxy(
    parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${allowedPort},127.0.0.1:${httpPort}`, EGRESS_MAX_CONNECTIONS: "3", EGRESS_CONNECT_TIMEOUT_MS: "1000" }),
    {
      resolve: async (host) => {
        resolveCalls.push(host);
        const found = names[host];
        if (!found) throw new Error("ENOTFOUND");
        return found;
      },
    },
  );
  socketPath = join(dir, "proxy.sock");
  await proxy.listen("vm_test", socketPath);
});

afterAll(async () => {
  await proxy?.close();
  for (const s of servers) s.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("egress proxy: CONNECT", () => {
  it("tunnels to an allowed address: 200, then bytes flow both ways", async () => {
    const answer = await exchange(socketPath, `CONNECT 127.0.0.1:${allowedPort} HTTP/1.1\r\nHost: x\r\n\r\n`, { then: "ping\n", until: /echo:ping/ });
    expect(answer).toMatch(/^HTTP\/1\.1 200 Connection Established\r\n\r\necho:ping\n$/);
  });

  it.each([
    ["the host's loopback on another port", () => `127.0.0.1:${otherPort}`, /127\.0\.0\.1 is a loopback address/],
    ["the metadata address", () => "169.254.169.254:80", /link-local/],
    ["IPv6 loopback", () => "[::1]:22", /::1 is a loopback address/],
    ["IPv4-mapped loopback", () => `[::ffff:127.0.0.1]:${otherPort}`, /loopback/],
    ["a private address", () => "10.0.0.1:5432", /private/],
    ["the unspecified address", () => `0.0.0.0:${otherPort}`, /unspecified/],
    ["a name that resolves to the host", () => `inside.test:${otherPort}`, /loopback/],
  ])("refuses %s with 403 and the error envelope", async (_what, target, why) => {
    const answer = await exchange(socketPath, `CONNECT ${target()} HTTP/1.1\r\n\r\n`);
    expect(statusOf(answer)).toBe(403);
    const body = bodyOf(answer);
    expect(body.error.code).toBe("forbidden");
    expect(body.error.message).toMatch(why);
    expect(body.error.requestId).toMatch(/^req_/);
  });

  it("resolves once and connects to the address it checked (no second lookup a rebinding name could answer differently)", async () => {
    resolveCalls.length = 0;
    // both.test → [10.9.9.9 (refused), 127.0.0.1 (refused, except on the allowed port)]: only the checked one is used.
    const answer = await exchange(socketPath, `CONNECT both.test:${allowedPort} HTTP/1.1\r\n\r\n`, { then: "x\n", until: /echo:x/ });
    expect(statusOf(answer)).toBe(200);
    expect(answer).toContain("echo:x");
    expect(resolveCalls).toEqual(["both.test"]);
  });

  it("answers 400 to a target that is not host:port and 502 to a name that does not resolve", async () => {
    expect(statusOf(await exchange(socketPath, "CONNECT nonsense HTTP/1.1\r\n\r\n"))).toBe(400);
    const unknown = await exchange(socketPath, "CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n");
    expect(statusOf(unknown)).toBe(502);
    expect(bodyOf(unknown).error.code).toBe("bad_gateway");
  });

  it("bounds the connections one VM holds: the one past the limit gets 429", async () => {
    const held: Socket[] = [];
    for (let i = 0; i < 3; i++) {
      const s = connect(socketPath);
      await new Promise((r) => s.once("connect", r));
      held.push(s);
    }
    await new Promise((r) => setTimeout(r, 50));
    expect(proxy.openConnections("vm_test")).toBe(3);
    const answer = await exchange(socketPath, `CONNECT 127.0.0.1:${allowedPort} HTTP/1.1\r\n\r\n`);
    expect(statusOf(answer)).toBe(429);
    expect(answer.toLowerCase()).toContain("retry-after: 1");
    for (const s of held) s.destroy();
    await new Promise((r) => setTimeout(r, 50));
    expect(proxy.openConnections("vm_test")).toBe(0);
  });

  it("parses authorities", () => {
    expect(parseAuthority("example.com:443")).toEqual({ host: "example.com", port: 443 });
    expect(parseAuthority("[2001:db8::1]:8443")).toEqual({ host: "[2001:db8::1]", port: 8443 });
    expect(parseAuthority("example.com")).toBeUndefined();
    expect(parseAuthority("a:b:1")).toBeUndefined();
  });
});

describe("egress proxy: plain HTTP in absolute form", () => {
  it("forwards to an allowed address in origin form, without the proxy's own headers", async () => {
    const answer = await exchange(
      socketPath,
      `GET http://127.0.0.1:${httpPort}/some/path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:${httpPort}\r\nProxy-Authorization: Basic eA==\r\nConnection: close\r\n\r\n`,
    );
    expect(statusOf(answer)).toBe(200);
    expect(answer).toMatch(/x-upstream: yes/i);
    expect(answer).toMatch(/hello from \/some\/path\?q=1$/);
    expect(seenByHttp.at(-1)).toEqual({ url: "/some/path?q=1", host: `127.0.0.1:${httpPort}`, proxyAuth: undefined });
  });

  it("refuses a host address with 403, and a request that is not absolute-form with 400", async () => {
    const refused = await exchange(socketPath, `GET http://127.0.0.1:${otherPort}/ HTTP/1.1\r\nHost: x\r\n\r\n`);
    expect(statusOf(refused)).toBe(403);
    expect(bodyOf(refused).error.code).toBe("forbidden");
    expect(statusOf(await exchange(socketPath, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"))).toBe(400);
  });
});

describe("the guestfwd relay", () => {
  it("carries a connection on its stdin/stdout to the proxy's socket and back, and exits when it ends", async () => {
    const relay = ensureEgressRelay(join(dir, "relay"));
    if (!("path" in relay)) throw new Error(relay.error);
    // A TCP pair stands in for libslirp's socket: the relay gets one end as stdin and stdout.
    const guestSide = await new Promise<{ ours: Socket; theirs: Socket }>((resolve) => {
      const srv = createServer((theirs) => resolve({ ours, theirs }));
      servers.push(srv);
      let ours: Socket;
      srv.listen(0, "127.0.0.1", () => (ours = connect((srv.address() as AddressInfo).port, "127.0.0.1")));
    });
    const child = spawn(relay.path, [socketPath], { stdio: [guestSide.theirs, guestSide.theirs, "inherit"] });
    guestSide.theirs.destroy(); // the relay holds it now
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    let got = "";
    guestSide.ours.on("data", (d) => (got += d.toString()));
    guestSide.ours.write(`CONNECT 127.0.0.1:${allowedPort} HTTP/1.1\r\n\r\n`);
    await until(() => got.includes("\r\n\r\n"));
    guestSide.ours.write("through the relay\n");
    await until(() => got.includes("echo:through the relay"));
    expect(got).toBe("HTTP/1.1 200 Connection Established\r\n\r\necho:through the relay\n");
    guestSide.ours.destroy();
    expect(await exited).toBe(0);
  });
});

async function until(ok: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 10));
  }
}
