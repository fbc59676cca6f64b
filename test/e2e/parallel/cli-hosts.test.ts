// `agentvm hosts ls|show|drain|undrain` against a real system (process driver, real Postgres, real sockets), run as a child process.
import { beforeAll, describe, expect, it } from "vitest";
import { eq, sql } from "drizzle-orm";
import { hosts } from "../../../schema/core.ts";
import { cliJson, cliSystem } from "../../helpers/cli.ts";

interface HostJson {
  id: string;
  healthy: boolean;
  why: string | null;
  live: boolean;
  agents: number;
  draining: boolean;
  drainingAt: string | null;
}

const cli = cliSystem("hosts");
const agentvm = cli.agentvm;
const json = cliJson;

beforeAll(async () => {
  // A second host that stopped heartbeating a minute ago, beside the system's own live one.
  await cli.sys.database.db.execute(
    sql`insert into hosts (id, url, driver, capacity_mib, last_heartbeat_at) values ('zz-gone', 'http://127.0.0.1:9', 'process', 2048, now() - interval '61 seconds')`,
  );
});

describe("agentvm hosts", () => {
  it("ls shows each host's health in a table and as JSON over every page", async () => {
    const hostId = cli.sys.host.hostId;
    const table = await agentvm(["hosts", "ls"]);
    expect(table.code, table.err).toBe(0);
    const lines = table.out.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^ID\s+HEALTH\s+LIVE\s+SKEW\s+USED\/CAP MIB\s+AWAKE\s+AGENTS\s+DRAINING\s+LAST HEARTBEAT$/);
    expect(lines.find((l) => l.startsWith(`${hostId} `))).toMatch(
      /\s+healthy\s+yes\s+[-+]?\d+\.\d s\s+\d+\/\d+\s+\d+\s+\d+\s+no\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/,
    );
    expect(lines.find((l) => l.startsWith("zz-gone "))).toMatch(/^zz-gone\s+no heartbeat for 6\d s\s+no\s+0\.0 s\s+0\/2048\s+0\s+0\s+no\s+/);

    const paged = json<{ hosts: HostJson[] }>(await agentvm(["hosts", "ls", "--json", "--page-size", "1"]));
    expect(paged.hosts.map((h) => h.id)).toEqual([hostId, "zz-gone"].sort());
    expect(paged.hosts.find((h) => h.id === "zz-gone")).toMatchObject({ healthy: false, live: false });
  });

  it("drain → show → undrain changes the host's row; unknown ids exit 1 with the API's message; a tenant token is refused", async () => {
    const hostId = cli.sys.host.hostId;
    const drained = await agentvm(["hosts", "drain", hostId]);
    expect(drained.code, drained.err).toBe(0);
    expect(drained.out).toMatch(new RegExp(`^${hostId} draining since \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\dZ; \\d+ agent\\(s\\) on it, \\d+ awake\\n$`));
    const row = (await cli.sys.database.db.select({ at: hosts.drainingAt }).from(hosts).where(eq(hosts.id, hostId)))[0]!;
    expect(row.at).toBeInstanceOf(Date);

    const shown = await agentvm(["hosts", "show", hostId]);
    expect(shown.code, shown.err).toBe(0);
    expect(shown.out).toMatch(/^health\s+draining$/m);
    expect(shown.out).toMatch(/^draining\s+since \d{4}-/m);
    expect(shown.out).toMatch(/^live\s+yes$/m);
    expect(json<HostJson>(await agentvm(["hosts", "show", hostId, "--json"]))).toMatchObject({ id: hostId, draining: true, healthy: false, why: "draining" });

    const undrained = await agentvm(["hosts", "undrain", hostId]);
    expect([undrained.code, undrained.out]).toEqual([0, `${hostId} healthy\n`]);
    expect((await cli.sys.database.db.select({ at: hosts.drainingAt }).from(hosts).where(eq(hosts.id, hostId)))[0]!.at).toBeNull();

    const missing = await agentvm(["hosts", "drain", "no-such-host"]);
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/^error not_found: host no-such-host not found \(request req_\w+\)$/m);
    const refused = await agentvm(["hosts", "ls"], await cli.sys.token());
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/^error forbidden: token lacks the operator scope \(request req_\w+\)$/m);
  });
});
