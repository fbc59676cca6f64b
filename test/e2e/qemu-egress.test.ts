// Egress from inside real QEMU VMs (the guest agent's PROBE/PROBEVIA: a process in the guest opening TCP connections
// through the guest kernel and QEMU's user network): the host's loopback through 10.0.2.2, the host's own address and
// the metadata address are unreachable with egress off and on; without egress the proxy (there for the tenant's
// upstreams) refuses every tunnel; with egress the only way out is the host's egress proxy, which refuses the host and special addresses and lets one allow-listed listener through, bytes both ways;
// both survive hibernate + wake from the snapshot, also when the agent's egress changed meanwhile.
import { createServer, type AddressInfo, type Server } from "node:net";
import { networkInterfaces } from "node:os";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { GuestAgentClient } from "../../fleet-agent/drivers/common/guest-agent.ts";
import type { VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { EGRESS_PROXY_GUEST_IP as PROXY_IP, EGRESS_PROXY_GUEST_PORT as PROXY_PORT } from "../../fleet-agent/egress/guest-address.ts";
import { EgressProxy } from "../../fleet-agent/egress/proxy.ts";
import { makeDriver, makeSpec } from "../helpers/qemu.ts";

/** A listener that counts its connections and answers every chunk with `echo:<chunk>`. */
interface Listener {
  port: number;
  accepted: number;
  server: Server;
}

function listener(host: string): Promise<Listener> {
  return new Promise((resolve) => {
    const l: Listener = {
      port: 0,
      accepted: 0,
      server: createServer((c) => {
        l.accepted++;
        c.on("data", (d) => c.write(`echo:${d.toString()}`));
        c.on("error", () => undefined);
      }),
    };
    l.server.listen(0, host, () => {
      l.port = (l.server.address() as AddressInfo).port;
      resolve(l);
    });
  });
}

/** The host's first non-loopback IPv4 address, if it has one. */
const hostAddress = Object.values(networkInterfaces())
  .flatMap((l) => l ?? [])
  .find((i) => i.family === "IPv4" && !i.internal)?.address;
if (!hostAddress) console.log("qemu-egress: this host has no non-loopback IPv4 address; the probes of the host's own address are left out");

const DIRECT_MS = 1500;

let allowed: Listener; // 127.0.0.1, allow-listed for the proxy
let other: Listener; // 127.0.0.1, not allow-listed
let own: Listener | undefined; // the host's own non-loopback address
let driver: QemuDriver;
let egress: EgressProxy;

beforeAll(async () => {
  allowed = await listener("127.0.0.1");
  other = await listener("127.0.0.1");
  if (hostAddress) own = await listener(hostAddress);
  // The test-only configuration: one loopback listener is allowed (no internet needed to prove the way out works).
  egress = new EgressProxy(parseEgressConfig({ EGRESS_ALLOW: `127.0.0.1:${allowed.port}` }));
  driver = await makeDriver({ egress });
});

afterAll(async () => {
  await driver?.close();
  for (const l of [allowed, other, own]) l?.server.close();
});

/** Direct connections from the guest to the host: none may connect, whatever the agent's egress. */
async function expectHostUnreachable(agent: GuestAgentClient): Promise<void> {
  const targets: [string, number][] = [
    ["10.0.2.2", allowed.port], // QEMU's alias for the host's loopback
    ["10.0.2.2", other.port],
    ["169.254.169.254", 80],
    ...(own && hostAddress
      ? ([
          [hostAddress, own.port],
          ["10.0.2.2", own.port],
        ] as [string, number][])
      : []),
  ];
  for (const [ip, port] of targets) {
    const r = await agent.probe(ip, port, DIRECT_MS);
    expect(r.outcome, `${ip}:${port} from inside the VM`).not.toBe("connected");
    expect(r.outcome).not.toBe("error"); // the probe itself worked: the network said no
    expect(r.received.length).toBe(0);
  }
}

/** Through the proxy: the allowed listener answers; the host's other services and the special addresses are refused. */
async function expectProxyFilters(agent: GuestAgentClient): Promise<void> {
  const through = await agent.probeVia(PROXY_IP, PROXY_PORT, `127.0.0.1:${allowed.port}`);
  expect(through).toEqual({ proxy: "connected", status: 200, received: Buffer.from("echo:agentvm-probe\n") });
  const refused = [
    `127.0.0.1:${other.port}`,
    `localhost:${other.port}`,
    `[::1]:${other.port}`,
    `[::ffff:127.0.0.1]:${other.port}`,
    "169.254.169.254:80",
    "10.0.2.2:22",
    ...(own && hostAddress ? [`${hostAddress}:${own.port}`] : []),
  ];
  for (const target of refused) {
    const r = await agent.probeVia(PROXY_IP, PROXY_PORT, target);
    expect(r, `CONNECT ${target} from inside the VM`).toEqual({ proxy: "connected", status: 403, received: Buffer.alloc(0) });
  }
}

describe("egress from inside a qemu VM", () => {
  /** Every VM a test made, destroyed at the end even when its test failed half-way. */
  const made: VmSpec[] = [];
  const vmSpec = (allowEgress: boolean): VmSpec => {
    const s = makeSpec({ allowEgress });
    made.push(s);
    return s;
  };
  afterAll(async () => {
    for (const s of made) await driver.destroy(s);
  });

  it("without egress nothing outside the VM is reachable (not 10.0.2.2, not the host's address; the proxy refuses tunnels); after a wake with egress turned on the proxy lets through", async () => {
    let spec = vmSpec(false);
    const before = { allowed: allowed.accepted, other: other.accepted, own: own?.accepted };
    const { vm } = await driver.boot(spec);
    const agent = driver.guestAgent(vm);
    // The probe can connect: the demo's own port inside the guest answers (so "not connected" below is the network's no).
    expect((await agent.probe("127.0.0.1", 8080, DIRECT_MS)).outcome).toBe("connected");
    await expectHostUnreachable(agent);
    // The proxy answers every VM (its tenant's upstreams are there), but a VM without egress is refused a tunnel, even
    // to the listener EGRESS_ALLOW names.
    expect((await agent.probe(PROXY_IP, PROXY_PORT, DIRECT_MS)).outcome).toBe("connected");
    expect(await agent.probeVia(PROXY_IP, PROXY_PORT, `127.0.0.1:${allowed.port}`, DIRECT_MS)).toEqual({
      proxy: "connected",
      status: 403,
      received: Buffer.alloc(0),
    });
    expect({ allowed: allowed.accepted, other: other.accepted, own: own?.accepted }).toEqual(before);

    // Egress turned on while hibernated: the netdev changes, the snapshot still restores, and the way out now works.
    expect((await driver.hibernate(vm)).completed).toBe(true);
    spec = { ...spec, allowEgress: true };
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("restore");
    const after = driver.guestAgent(woke.vm);
    await expectProxyFilters(after);
    await expectHostUnreachable(after);
    await driver.destroy(spec);
  }, 240_000);

  it("with egress the only way out is the proxy: the host is unreachable directly, the proxy refuses it and lets the allowed listener through, also after hibernate + wake", async () => {
    const spec = vmSpec(true);
    const { vm } = await driver.boot(spec);
    let agent = driver.guestAgent(vm);
    await expectHostUnreachable(agent);
    const before = { other: other.accepted, own: own?.accepted };
    await expectProxyFilters(agent);
    // Each probe's connection ends with it: the guest closes, its relay exits, the proxy lets go.
    for (let i = 0; i < 100 && egress.openConnections(spec.vmId) > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(egress.openConnections(spec.vmId)).toBe(0);
    // Nothing refused ever reached the host's listeners.
    expect({ other: other.accepted, own: own?.accepted }).toEqual(before);

    expect((await driver.hibernate(vm)).completed).toBe(true);
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("restore");
    agent = driver.guestAgent(woke.vm);
    await expectHostUnreachable(agent);
    await expectProxyFilters(agent);
    expect({ other: other.accepted, own: own?.accepted }).toEqual(before);
  }, 240_000);
});
