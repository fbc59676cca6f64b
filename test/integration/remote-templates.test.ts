// Templates through the remote fleet and real host ingresses (signed host calls): every live host asked once, the lists merged, a host that fails left out and logged.
import { createServer } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { systemClock } from "../../lib/clock.ts";
import { componentKey } from "../../lib/host-token.ts";
import { createLogger, silentLogger, type Logger } from "../../lib/log.ts";
import { hosts } from "../../schema/core.ts";
import { hostOpPaths, hostTokenHeader, signHostCall } from "../../contracts/host-protocol.ts";
import { createDbPlacement } from "../../gateway/placement.ts";
import { createRemoteFleet } from "../../gateway/remote-fleet.ts";
import { freshDatabase } from "../helpers/db.ts";
import { startHostInProcess, testComponentSecret, type InProcessHost } from "../helpers/worker-stack.ts";
import { FakeTemplateDriver, failedTemplate, readyTemplate } from "../helpers/fake-template-driver.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
const daemons: InProcessHost[] = [];
const drivers: FakeTemplateDriver[] = [];

async function startHost(): Promise<InProcessHost> {
  const driver = new FakeTemplateDriver();
  drivers.push(driver);
  const daemon = await startHostInProcess(database, { driver });
  daemons.push(daemon);
  return daemon;
}

/** A loopback port nothing listens on (taken, then released). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

let a: InProcessHost;
let b: InProcessHost;

beforeAll(async () => {
  database = await freshDatabase();
  a = await startHost();
  b = await startHost();
  // A host with a fresh heartbeat whose ingress is gone (crashed since its last beat), and one whose heartbeat stopped long ago.
  await database.db.insert(hosts).values({ id: "hst_gone", url: `http://127.0.0.1:${await closedPort()}`, driver: "qemu", capacityMiB: 1024 });
  await database.db
    .insert(hosts)
    .values({ id: "hst_stale", url: "http://127.0.0.1:9", driver: "qemu", capacityMiB: 1024, lastHeartbeatAt: new Date(Date.now() - 3_600_000) });
}, 60_000);

afterAll(async () => {
  for (const d of daemons) await d.stop();
  await database?.close();
});

function fleet(log: Logger = silentLogger, withListing = true) {
  const placement = createDbPlacement(database.db, { liveWindowMs: 30_000, cacheTtlMs: 0, clock: systemClock });
  const { liveHosts: _unlisted, ...withoutListing } = placement;
  return createRemoteFleet({ placement: withListing ? placement : withoutListing, key: componentKey(testComponentSecret), log, controlTimeoutMs: 5_000 });
}

describe("templates over the host protocol", () => {
  it("asks every live host once and merges their lists by host then key; a host that fails is left out and logged", async () => {
    drivers[0]!.templates = [readyTemplate];
    drivers[1]!.templates = [failedTemplate, readyTemplate];
    const lines: string[] = [];
    const listed = await fleet(createLogger({ write: (l) => lines.push(l) })).templates!();

    const { dir: _dir, ...ready } = readyTemplate;
    const expected = [
      { ...ready, hostId: a.hostId },
      { ...ready, hostId: b.hostId },
      { ...failedTemplate, hostId: b.hostId },
    ].sort((x, y) => x.hostId.localeCompare(y.hostId) || x.key.localeCompare(y.key));
    expect(listed).toEqual(expected);
    expect(JSON.stringify(listed)).not.toContain("/var/lib/agentvm");

    // The live host that did not answer is logged; the stale one was never asked.
    const warned = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === "host templates unavailable");
    expect(warned.map((l) => l.hostId)).toEqual(["hst_gone"]);
    expect(lines.join("\n")).not.toContain("hst_stale");
  });

  it("a host whose driver fails to list answers its error; the others' templates still come back", async () => {
    drivers[0]!.templates = [readyTemplate];
    drivers[1]!.listError = new Error("templates root unreadable");
    try {
      const lines: string[] = [];
      const listed = await fleet(createLogger({ write: (l) => lines.push(l) })).templates!();
      expect(listed.map((t) => t.hostId)).toEqual([a.hostId]);
      const warned = lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === "host templates unavailable");
      expect(warned.map((l) => l.hostId).sort()).toEqual([b.hostId, "hst_gone"].sort());
    } finally {
      drivers[1]!.listError = undefined;
    }
  });

  it("without a placement that lists hosts, the fleet has no templates (the API then lists none)", () => {
    expect(fleet(silentLogger, false).templates).toBeUndefined();
  });

  it("the ingress serves templates only for a templates token, on GET", async () => {
    const key = componentKey(testComponentSecret);
    const url = a.url.replace(/\/$/, "") + hostOpPaths.templates;
    const good = await fetch(url, { headers: { [hostTokenHeader]: await signHostCall(key, a.hostId, { op: "templates" }) } });
    expect(good.status).toBe(200);
    expect(((await good.json()) as { templates: { hostId: string }[] }).templates.every((t) => t.hostId === a.hostId)).toBe(true);
    const otherOp = await fetch(url, { headers: { [hostTokenHeader]: await signHostCall(key, a.hostId, { op: "status", agentId: "agt_x" }) } });
    expect(otherOp.status).toBe(401);
    const otherHost = await fetch(url, { headers: { [hostTokenHeader]: await signHostCall(key, b.hostId, { op: "templates" }) } });
    expect(otherHost.status).toBe(401);
    const posted = await fetch(url, { method: "POST", headers: { [hostTokenHeader]: await signHostCall(key, a.hostId, { op: "templates" }) } });
    expect(posted.status).toBe(404); // only GET is routed
  });
});
