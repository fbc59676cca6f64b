// What the egress proxy tells its observer about each exchange (the host's doze: fleet-agent/host/doze.ts), over real
// sockets on loopback: a plain HTTP request waits once its body is out and is answered by its head and chunks, held
// while the observer's promise is pending; a CONNECT tunnel waits each time the guest speaks last; a far end streaming
// chunks 50 ms apart never makes its tunnel wait again once it started answering.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import type { ExchangeObserver } from "../../fleet-agent/egress/exchanges.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";

const dir = mkdtempSync(join(tmpdir(), "egress-exchanges-"));
const servers: Server[] = [];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function listen(s: Server): Promise<number> {
  servers.push(s);
  return new Promise((resolve) => s.listen(0, "127.0.0.1", () => resolve((s.address() as AddressInfo).port)));
}

/** Records every call; while `hold` is set, `answer` returns a promise the test resolves (a dozing VM being resumed). */
class Recorder implements ExchangeObserver {
  events: string[] = [];
  hold = false;
  private release: (() => void)[] = [];
  waiting(vmId: string, id: string): void {
    this.events.push(`waiting ${vmId} ${id}`);
  }
  answer(vmId: string, id: string): Promise<void> | undefined {
    this.events.push(`answer ${vmId} ${id}`);
    if (!this.hold) return undefined;
    return new Promise<void>((r) => this.release.push(r));
  }
  ended(vmId: string, id: string): void {
    this.events.push(`ended ${vmId} ${id}`);
  }
  /** Lets every held answer through (the VM runs again). */
  resume(): void {
    this.hold = false;
    for (const r of this.release.splice(0)) r();
  }
  kinds(): string[] {
    return this.events.map((e) => e.split(" ")[0]!);
  }
  reset(): void {
    this.events = [];
  }
}

const recorder = new Recorder();
let proxy: EgressProxy;
let socketPath: string;
let slowHttpPort: number;
let echoPort: number;
let streamPort: number;

beforeAll(async () => {
  // Answers after 150 ms: head, then two chunks 30 ms apart.
  slowHttpPort = await listen(
    createHttpServer((req, res) => {
      req.resume();
      req.on("end", () =>
        setTimeout(() => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.write("first,");
          setTimeout(() => res.end("second"), 30);
        }, 150),
      );
    }),
  );
  echoPort = await listen(createServer((c) => c.on("data", (d) => c.write(`echo:${d.toString()}`))));
  // On the guest's first bytes: eight chunks 50 ms apart (a model's token stream), then the end.
  streamPort = await listen(
    createServer((c) => {
      c.once("data", () => {
        let n = 0;
        const tick = setInterval(() => {
          c.write(`token${n++};`);
          if (n === 8) {
            clearInterval(tick);
            c.end();
          }
        }, 50);
      });
    }),
  );
  proxy = new EgressProxy(parseEgressConfig({ EGRESS_ALLOW: "127.0.0.1" }), { exchanges: recorder });
  socketPath = join(dir, "proxy.sock");
  await proxy.listen("vm_x1", socketPath);
});

afterAll(async () => {
  await proxy.close();
  for (const s of servers) s.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A guest connection to the proxy, collecting what it reads. */
function guest(): { socket: Socket; text: () => string; closed: Promise<void> } {
  const socket = connect(socketPath);
  let got = "";
  socket.on("data", (d) => (got += d.toString()));
  const closed = new Promise<void>((r) => socket.on("close", () => r()));
  return { socket, text: () => got, closed };
}

async function until(cond: () => boolean, ms = 3000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("timed out waiting for a condition");
    await sleep(5);
  }
}

describe("egress proxy: exchanges told to the observer", () => {
  it("plain HTTP: waiting once the request is out, then an answer for the head and each chunk, ended at the close", async () => {
    recorder.reset();
    const g = guest();
    g.socket.write(`POST http://127.0.0.1:${slowHttpPort}/slow HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello`);
    await g.closed;
    expect(g.text()).toMatch(/^HTTP\/1\.1 200/);
    expect(g.text()).toMatch(/first,\r\n6\r\nsecond/); // chunked, in order
    const kinds = recorder.kinds();
    expect(kinds[0]).toBe("waiting");
    expect(kinds.filter((k) => k === "waiting")).toHaveLength(1);
    expect(kinds.filter((k) => k === "answer").length).toBeGreaterThanOrEqual(3); // the head and two chunks
    expect(kinds.at(-1)).toBe("ended");
    // One exchange id throughout, under the VM's id.
    expect(new Set(recorder.events.map((e) => e.split(" ").slice(1).join(" "))).size).toBe(1);
    expect(recorder.events[0]).toMatch(/^waiting vm_x1 req_/);
  });

  it("plain HTTP: the answer's bytes are held until the observer's promise resolves", async () => {
    recorder.reset();
    recorder.hold = true;
    const g = guest();
    g.socket.write(`GET http://127.0.0.1:${slowHttpPort}/held HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n`);
    await until(() => recorder.kinds().includes("answer"));
    await sleep(120); // the whole answer has reached the proxy by now
    expect(g.text()).toBe(""); // nothing written while the VM "dozes"
    recorder.resume();
    await g.closed;
    expect(g.text()).toMatch(/^HTTP\/1\.1 200/);
    expect(g.text()).toMatch(/first,\r\n6\r\nsecond/); // chunked, in order
  });

  it("CONNECT: waits each time the guest speaks last, once per change of direction", async () => {
    recorder.reset();
    const g = guest();
    g.socket.write(`CONNECT 127.0.0.1:${echoPort} HTTP/1.1\r\nhost: 127.0.0.1:${echoPort}\r\n\r\n`);
    await until(() => g.text().includes("200 Connection Established"));
    g.socket.write("one");
    await until(() => g.text().includes("echo:one"));
    g.socket.write("two");
    await until(() => g.text().includes("echo:two"));
    expect(recorder.kinds()).toEqual(["waiting", "answer", "waiting", "answer"]);
    // Held answer bytes: written only after the promise resolves.
    recorder.hold = true;
    g.socket.write("three");
    await until(() => recorder.kinds().length === 6);
    await sleep(50);
    expect(g.text()).not.toContain("echo:three");
    recorder.resume();
    await until(() => g.text().includes("echo:three"));
    g.socket.destroy();
    await until(() => recorder.kinds().at(-1) === "ended");
    expect(recorder.kinds().filter((k) => k === "ended")).toHaveLength(1);
  });

  it("CONNECT: a far end streaming chunks 50 ms apart never makes the tunnel wait again after it started answering", async () => {
    recorder.reset();
    const g = guest();
    g.socket.write(`CONNECT 127.0.0.1:${streamPort} HTTP/1.1\r\nhost: 127.0.0.1:${streamPort}\r\n\r\n`);
    await until(() => g.text().includes("200 Connection Established"));
    g.socket.write("request");
    await g.closed;
    expect(g.text()).toContain("token7;");
    const kinds = recorder.kinds();
    expect(kinds[0]).toBe("waiting");
    const firstAnswer = kinds.indexOf("answer");
    expect(firstAnswer).toBe(1);
    expect(kinds.slice(firstAnswer).filter((k) => k === "waiting")).toEqual([]);
    expect(kinds.filter((k) => k === "answer").length).toBeGreaterThanOrEqual(8);
    expect(kinds.at(-1)).toBe("ended");
  });
});
