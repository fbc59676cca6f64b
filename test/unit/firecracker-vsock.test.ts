// Hybrid vsock (Firecracker's host side of virtio-vsock) and the guest agent protocol over it, against a fake
// vsock device on a real unix socket: the CONNECT/OK handshake, refusals, bytes arriving with the OK line,
// retrying until the guest agent listens, and the clock fix through it.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { fixGuestClock, hostNowNs } from "../../fleet-agent/drivers/common/guest-agent.ts";
import { connectVsock, openGuestAgent, VsockConnectError, waitForGuestAgent } from "../../fleet-agent/drivers/firecracker/vsock.ts";

const root = mkdtempSync(join(tmpdir(), "fcv-"));
let n = 0;
const servers: Server[] = [];
const sockets = new Set<Socket>();

interface FakeDevice {
  path: string;
  listening: Set<number>;
  connects: string[];
}

/**
 * A fake vsock device: answers `OK <hostport>` when `port` is in `listening`, else closes (as Firecracker does).
 * `onOpen` takes the stream after OK (the guest side); `greeting` is sent in the same write as the OK line.
 */
async function device(opts: { listening?: number[]; greeting?: string; onOpen?: (s: Socket) => void; answer?: string } = {}): Promise<FakeDevice> {
  const path = join(root, `v${n++}.sock`);
  const dev: FakeDevice = { path, listening: new Set(opts.listening ?? [1024]), connects: [] };
  const server = createServer((sock) => {
    sockets.add(sock);
    sock.on("close", () => sockets.delete(sock));
    let buf = "";
    const onData = (chunk: Buffer) => {
      buf += chunk.toString();
      const nl = buf.indexOf("\n");
      if (nl < 0) return;
      sock.off("data", onData);
      const line = buf.slice(0, nl);
      dev.connects.push(line);
      const port = Number(/^CONNECT (\d+)$/.exec(line)?.[1]);
      if (opts.answer !== undefined) return void sock.end(opts.answer);
      if (!dev.listening.has(port)) return void sock.destroy();
      sock.write(`OK 1073741824\n${opts.greeting ?? ""}`);
      opts.onOpen?.(sock);
    };
    sock.on("data", onData);
    sock.on("error", () => {});
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(path, () => r()));
  return dev;
}

/** The guest agent's side of the line protocol, with a guest clock `offsetMs` away from the host's. */
function guestAgent(state: { offsetNs: bigint; lastSet: bigint; leases: number }) {
  return (sock: Socket) => {
    let buf = "";
    sock.on("data", (chunk) => {
      buf += chunk.toString();
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const [id, cmd, arg] = buf.slice(0, nl).split(" ");
        buf = buf.slice(nl + 1);
        const now = () => hostNowNs() + state.offsetNs;
        const fmt = (ns: bigint) => `${ns / 1_000_000_000n}.${(ns % 1_000_000_000n).toString().padStart(9, "0")}`;
        if (cmd === "PING") sock.write(`${id} OK pong\n`);
        else if (cmd === "GETTIME") sock.write(`${id} OK ${fmt(now())}\n`);
        else if (cmd === "LEASES") sock.write(`${id} OK ${state.leases}\n`);
        else if (cmd === "SETTIME") {
          const [s, ns] = arg!.split(".");
          const t = BigInt(s!) * 1_000_000_000n + BigInt(ns!);
          if (t < state.lastSet) sock.write(`${id} OK stale ${fmt(now())}\n`);
          else {
            state.lastSet = t;
            state.offsetNs = t - hostNowNs();
            sock.write(`${id} OK ${fmt(now())}\n`);
          }
        } else sock.write(`${id} ERR unknown\n`);
      }
    });
  };
}

afterEach(async () => {
  for (const s of sockets) s.destroy(); // a failed test must not leave server.close() waiting
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("hybrid vsock", () => {
  it("sends CONNECT <port> and hands over the stream after OK, keeping bytes that came with the OK line", async () => {
    const dev = await device({ listening: [5000], greeting: "hello from the guest\n" });
    const { socket, hostPort } = await connectVsock(dev.path, 5000);
    expect(dev.connects).toEqual(["CONNECT 5000"]);
    expect(hostPort).toBe(1073741824);
    const got = new Promise<string>((r) => socket.once("data", (d) => r(d.toString())));
    socket.resume();
    expect(await got).toBe("hello from the guest\n");
    socket.destroy();
  });

  it("a guest port nobody listens on: the device closes, the error says so", async () => {
    const dev = await device({ listening: [] });
    await expect(connectVsock(dev.path, 1024)).rejects.toThrow(/closed before OK/);
  });

  it("an answer other than OK is an error naming it", async () => {
    const dev = await device({ answer: "NOPE\n" });
    await expect(connectVsock(dev.path, 1024)).rejects.toThrow(/unexpected answer "NOPE"/);
  });

  it("no vsock socket at all (VM not started) is a VsockConnectError", async () => {
    await expect(connectVsock(join(root, "absent.sock"), 1024)).rejects.toBeInstanceOf(VsockConnectError);
  });

  it("runs the guest agent protocol over the stream: ping, leases, time", async () => {
    const state = { offsetNs: 0n, lastSet: 0n, leases: 2 };
    const dev = await device({ onOpen: guestAgent(state) });
    const agent = await openGuestAgent(dev.path, 1024);
    expect(await agent.leases()).toBe(2);
    const t = await agent.getTime();
    expect(Number(t / 1_000_000n) - Date.now()).toBeLessThan(50);
    const applied = hostNowNs() - 5_000_000_000n;
    const set = await agent.setTime(applied);
    expect(set.stale).toBe(false);
    expect(Number((set.guestNs - applied) / 1_000_000n)).toBeLessThan(50);
    expect((await agent.setTime(applied - 1n)).stale).toBe(true); // a delayed retry is ignored
    agent.close();
  });

  it("waits until the guest agent listens (after boot or restore), then fixes a clock 30 s behind", async () => {
    const state = { offsetNs: -30_000_000_000n, lastSet: 0n, leases: 0 };
    const dev = await device({ listening: [], onOpen: guestAgent(state) });
    setTimeout(() => dev.listening.add(1024), 300);
    const started = performance.now();
    const agent = await waitForGuestAgent(dev.path, 1024, { deadlineMs: 5000 });
    expect(performance.now() - started).toBeGreaterThanOrEqual(250);
    expect(dev.connects.length).toBeGreaterThan(1);
    const fix = await fixGuestClock(agent);
    expect(fix.skewBeforeMs).toBeLessThan(-29_000);
    expect(Math.abs(fix.skewAfterMs)).toBeLessThan(50);
    agent.close();
  });

  it("gives up at the deadline, or at once when told the VM is gone", async () => {
    const dev = await device({ listening: [] });
    await expect(waitForGuestAgent(dev.path, 1024, { deadlineMs: 300 })).rejects.toThrow(/did not answer within 300 ms: .*closed before OK/);
    await expect(waitForGuestAgent(dev.path, 1024, { deadlineMs: 5000, gaveUp: () => "firecracker exited" })).rejects.toThrow(
      "guest agent unreachable: firecracker exited",
    );
  });
});
