// ForwardContext.target "exec" through every fleet, on real sockets: a host core whose fake driver's VM is a loopback HTTP server (the workload) and a fake exec server (its `execTarget`), the local fleet, and a remote gateway over a host's ingress.
//
// What it pins: the request reaches the exec server with the key the host adds (never the gateway), a client's key
// header never reaches a workload, a running exec holds the VM in flight (no hibernation under it), a driver without
// `execTarget` is 501 exec_unsupported and its AppErrors pass as they are, the remote target rides in the signed call,
// and a call is full duplex on both fleets (a terminal's input streams while its output comes back).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loopbackDriver } from "../helpers/loopback-driver.ts";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serve, type ServerType } from "@hono/node-server";
import { systemClock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import { silentLogger } from "../../lib/log.ts";
import { Host } from "../../fleet-agent/host.ts";
import { createLocalFleet, type LocalFleet } from "../../fleet-agent/local-fleet.ts";
import { createIngress } from "../../fleet-agent/ingress.ts";
import { createMemoryHostStore } from "../../fleet-agent/store.ts";
import type { ExecTarget, VmDriver } from "../../fleet-agent/drivers/driver.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { Fleet } from "../../contracts/fleet.ts";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import { createNodeHostFetch } from "../../gateway/node/remote-fleet.ts";
import type { PlacedHost, Placement } from "../../gateway/placement.ts";
import { encodeSpec } from "../../contracts/exec-wire.ts";
import { startFakeExecServer, type FakeExecServer } from "../helpers/fake-exec-server.ts";

let workload: Server;
let workloadPort: number;
/** An exec server stand-in that answers at once and echoes each piece of the body as it comes (a terminal's duplex). */
let duplexEcho: Server;
let duplexPort: number;
const duplexAgent = "agt_ef0000dd";
let exec: FakeExecServer;
let root: string;
const keysSeenByWorkload: (string | undefined)[] = [];

const driverWith = (execTarget: VmDriver["execTarget"]): VmDriver => loopbackDriver(() => workloadPort, execTarget ? { execTarget } : {});

function hostWith(driver: VmDriver, id: string): Host {
  return new Host({
    config: {
      hostId: id,
      vmsDir: `/nonexistent/agentvm-exec-fleet-${id}`,
      wakeQueueLimit: 10,
      wakeDeadlineMs: 5000,
      reaperIntervalMs: 60_000,
      cpuBusyThreshold: 0.2,
      drainTimeoutMs: 0,
    },
    driver,
    store: createMemoryHostStore(),
    clock: systemClock,
    log: silentLogger,
    activity: { active: () => {}, inactive: () => {} },
  });
}

const spec = (id: string): AgentSpec => ({
  id,
  tenantId: "ten_a",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  idleTimeoutMs: 60_000,
  streamIdleMs: 100,
  allowEgress: false,
});

const execRequest = (argv: string[]) =>
  new Request("http://exec/v1/exec", { method: "POST", body: encodeSpec({ argv }), headers: { "x-agentvm-exec-key": "f".repeat(64) } });

let host: Host;
let fleet: LocalFleet;
const targets: ExecTarget[] = [];

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "exec-api-fleet-"));
  exec = await startFakeExecServer(root);
  workload = createServer((req, res) => {
    const k = req.headers["x-agentvm-exec-key"];
    keysSeenByWorkload.push(typeof k === "string" ? k : undefined);
    res.end("workload");
  });
  await new Promise<void>((r) => workload.listen(0, "127.0.0.1", r));
  workloadPort = (workload.address() as AddressInfo).port;
  duplexEcho = createServer((req, res) => {
    res.writeHead(200, { "content-type": "application/octet-stream" });
    res.flushHeaders();
    req.on("data", (chunk: Buffer) => res.write(chunk));
    req.on("end", () => res.end("<end>"));
  });
  await new Promise<void>((r) => duplexEcho.listen(0, "127.0.0.1", r));
  duplexPort = (duplexEcho.address() as AddressInfo).port;
  host = hostWith(
    driverWith(async (vm) => {
      if (vm.spec.agentId === duplexAgent) return { host: "127.0.0.1", port: duplexPort, key: exec.key };
      const t = { host: "127.0.0.1", port: exec.port, key: exec.key };
      targets.push(t);
      return t;
    }),
    "host_ef",
  );
  fleet = createLocalFleet(host, silentLogger);
});

afterAll(async () => {
  await fleet?.close();
  await host?.stop();
  await exec?.close();
  await new Promise<void>((r) => workload.close(() => r()));
  await new Promise<void>((r) => duplexEcho.close(() => r()));
  if (root) rmSync(root, { recursive: true, force: true });
});

describe("the local fleet with target exec", () => {
  it("sends the call to the driver's exec target with the host's key (a caller's own key header replaced)", async () => {
    const res = await fleet.forward(spec("agt_ef000001"), execRequest(["echo", "hi"]), { requestId: "req_ef01", reason: "api", target: "exec" });
    expect(res.status).toBe(200);
    expect(res.headers.get("x-wake")).toBe("boot");
    await res.arrayBuffer();
    expect(exec.seen.at(-1)).toMatchObject({ method: "POST", path: "/v1/exec", key: exec.key });
    expect(targets.length).toBeGreaterThan(0);
  });

  it("a workload call never carries a key header, whatever the client sent", async () => {
    const res = await fleet.forward(spec("agt_ef000001"), new Request("http://agent/", { headers: { "x-agentvm-exec-key": exec.key } }), {
      requestId: "req_ef02",
      reason: "request",
    });
    expect(await res.text()).toBe("workload");
    expect(keysSeenByWorkload.at(-1)).toBeUndefined();
  });

  it("a running exec holds the VM in flight: no hibernation under it however quiet it is, until its answer is over", async () => {
    const agent = spec("agt_ef000002");
    const res = await fleet.forward(agent, execRequest(["big", String(8 * 1024 * 1024)]), { requestId: "req_ef03", reason: "api", target: "exec" });
    // Past the stream idle window (100 ms) with nothing read: a workload's stream would count as idle by now.
    await new Promise((r) => setTimeout(r, 300));
    expect(host.status(agent.id)?.inFlight).toBe(1);
    await expect(host.hibernateNow(agent.id)).rejects.toMatchObject({ code: "conflict" });
    await res.arrayBuffer();
    expect(host.status(agent.id)?.inFlight).toBe(0);
    expect(await host.hibernateNow(agent.id)).toBe("hibernated");
  });

  it("a driver without execTarget answers 501 exec_unsupported; execTarget's AppErrors pass as they are", async () => {
    const plain = hostWith(driverWith(undefined), "host_ef2");
    const plainFleet = createLocalFleet(plain, silentLogger);
    const outdated = hostWith(
      driverWith(async () => {
        throw new AppError("guest_outdated", "this agent's guest was built before exec; restart it to update");
      }),
      "host_ef3",
    );
    const outdatedFleet = createLocalFleet(outdated, silentLogger);
    try {
      await expect(
        plainFleet.forward(spec("agt_ef000003"), execRequest(["echo"]), { requestId: "req_ef04", reason: "api", target: "exec" }),
      ).rejects.toMatchObject({
        code: "exec_unsupported",
      });
      expect(plain.status("agt_ef000003")?.inFlight).toBe(0);
      await expect(
        outdatedFleet.forward(spec("agt_ef000004"), execRequest(["echo"]), { requestId: "req_ef05", reason: "api", target: "exec" }),
      ).rejects.toMatchObject({ code: "guest_outdated" });
    } finally {
      await plainFleet.close();
      await outdatedFleet.close();
      await plain.stop();
      await outdated.stop();
    }
  });
});

describe("an agent deleted while its exec call reaches the VM", () => {
  it("answers 404 not_found (the driver's own failure is not a 502)", async () => {
    let arrived!: () => void;
    const reached = new Promise<void>((r) => (arrived = r));
    let stopped!: () => void;
    const gone = new Promise<void>((r) => (stopped = r));
    const driver = driverWith(async () => {
      arrived();
      await gone; // the delete stops the VM meanwhile
      throw new Error("VM vm_ef000005 is not running");
    });
    driver.stop = async () => stopped();
    const racing = hostWith(driver, "host_ef4");
    const racingFleet = createLocalFleet(racing, silentLogger);
    try {
      const call = racingFleet.forward(spec("agt_ef000005"), execRequest(["echo"]), { requestId: "req_ef06", reason: "api", target: "exec" });
      await reached;
      const removal = racing.remove("agt_ef000005");
      await expect(call).rejects.toMatchObject({ code: "not_found" });
      await removal;
    } finally {
      await racingFleet.close();
      await racing.stop();
    }
  });
});

describe("a remote gateway over the host's ingress", () => {
  let ingress: ServerType;
  let remote: Fleet;
  let hostFetch: ReturnType<typeof createNodeHostFetch>;
  const ingressHeaders: Headers[] = [];
  const key = new Uint8Array(32).fill(3);

  beforeAll(async () => {
    const app = createIngress({ hostId: "host_ef", key, fleet, log: silentLogger });
    const port = await new Promise<number>((resolve) => {
      ingress = serve(
        {
          fetch: (req) => {
            ingressHeaders.push(req.headers);
            return app.fetch(req);
          },
          port: 0,
          hostname: "127.0.0.1",
        },
        (info) => resolve(info.port),
      );
    });
    const placed: PlacedHost = { id: "host_ef", url: `http://127.0.0.1:${port}/`, live: true, generation: 0 };
    const placement: Placement = {
      hostFor: async () => placed,
      currentHost: async () => placed,
      currentHosts: async (ids) => new Map(ids.map((id) => [id, placed])),
      forget: () => undefined,
    };
    hostFetch = createNodeHostFetch({ connectTimeoutMs: 5000, headersTimeoutMs: 30_000 });
    remote = createRemoteFleet({ placement, key, log: silentLogger, fetch: hostFetch });
  });

  afterAll(async () => {
    await hostFetch?.close();
    await new Promise<void>((r) => ingress.close(() => r()));
  });

  it("carries the target in the signed call: the host reaches the exec server, the key stays on the host", async () => {
    const before = exec.seen.length;
    const req = new Request("http://exec/v1/exec", { method: "POST", body: encodeSpec({ argv: ["echo", "remote"] }) });
    const res = await remote.forward(spec("agt_ef000005"), req, {
      requestId: "req_ef06",
      reason: "api",
      target: "exec",
      limits: { responseTimeoutMs: 30_000, proxyIdleTimeoutMs: 30_000 },
    });
    expect(res.status).toBe(200);
    const body = new Uint8Array(await res.arrayBuffer());
    expect(new TextDecoder().decode(body)).toContain("remote\n");
    expect(exec.seen.length).toBe(before + 1);
    expect(exec.seen.at(-1)).toMatchObject({ path: "/v1/exec", key: exec.key });
    expect(ingressHeaders.at(-1)!.get("x-agentvm-exec-key")).toBeNull();
    // Without the target the same call goes to the workload.
    const plain = await remote.forward(spec("agt_ef000005"), new Request("http://agent/"), { requestId: "req_ef07", reason: "request" });
    expect(await plain.text()).toBe("workload");
  });

  it("is full duplex: each piece of the request body is answered while the body is still open, on the local and the remote fleet", async () => {
    for (const via of [fleet as Fleet, remote]) {
      await duplexRoundTrips(via);
    }
  });
});

/** Sends the body a piece at a time, each only after the last one's echo came back: possible only if the call is full duplex. */
async function duplexRoundTrips(via: Fleet): Promise<void> {
  let input!: ReadableStreamDefaultController<Uint8Array>;
  const enc = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      input = c;
      c.enqueue(enc.encode("spec;"));
    },
  });
  const req = new Request("http://exec/v1/exec", { method: "POST", body, duplex: "half" } as RequestInit);
  const res = await via.forward(spec(duplexAgent), req, {
    requestId: "req_efdd",
    reason: "api",
    target: "exec",
    limits: { responseTimeoutMs: 30_000, proxyIdleTimeoutMs: 30_000 },
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  let got = "";
  const until = async (text: string) => {
    while (!got.includes(text)) {
      const next = await reader.read();
      if (next.done) throw new Error(`the answer ended before ${text}: ${got}`);
      got += new TextDecoder().decode(next.value);
    }
  };
  await until("spec;");
  for (const word of ["one;", "two;", "three;"]) {
    input.enqueue(enc.encode(word));
    await until(word);
  }
  input.close();
  await until("<end>");
}
