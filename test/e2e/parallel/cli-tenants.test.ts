// `agentvm tenants …` and `agentvm token --operator` against a real system (process driver, real Postgres, real sockets), run as a child process.
import { describe, expect, it } from "vitest";
import { cliJson, cliSystem } from "../../helpers/cli.ts";

const cli = cliSystem("tenants");
const agentvm = cli.agentvm;
const json = cliJson;

describe("agentvm tenants", () => {
  it("create → ls → show → suspend → resume → rm with the operator token npm start gives", async () => {
    const created = await agentvm(["tenants", "create", "--id", "ten_cli", "--name", "CLI tenant", "--time-zone", "Europe/Paris"]);
    expect(created.code, created.err).toBe(0);
    expect(created.out).toBe("ten_cli\n");
    const generated = await agentvm(["tenants", "create", "--name", "Generated"]);
    expect(generated.out).toMatch(/^ten_[0-9a-z]{16}\n$/);
    const dup = await agentvm(["tenants", "create", "--id", "ten_cli", "--name", "again"]);
    expect(dup.code).toBe(1);
    expect(dup.err).toMatch(/^error conflict: tenant ten_cli exists \(request req_\w+\)$/m);

    const table = await agentvm(["tenants", "ls"]);
    expect(table.code, table.err).toBe(0);
    const lines = table.out.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^ID\s+NAME\s+STATUS\s+TIME ZONE\s+CREATED\s+REASON$/);
    expect(lines.find((l) => l.startsWith("ten_cli "))).toMatch(/^ten_cli\s+CLI tenant\s+active\s+Europe\/Paris\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$/);
    expect(lines.some((l) => l.startsWith("ten_demo "))).toBe(true);
    // Every page followed: three tenants, one per page.
    const paged = await agentvm(["tenants", "ls", "--json", "--page-size", "1"]);
    expect(
      json<{ tenants: { id: string }[] }>(paged)
        .tenants.map((t) => t.id)
        .sort(),
    ).toEqual(["ten_cli", "ten_demo", generated.out.trim()].sort());

    // The tenant's agent, so suspension has something to hibernate.
    const tenantToken = await cli.sys.token({ tenant: "ten_cli" });
    const agent = await cli.sys.createAgent({ idleTimeoutMs: 600_000 }, tenantToken);
    expect((await cli.sys.call(`/a/${agent.id}/`, { token: tenantToken })).status).toBe(200);

    const suspended = await agentvm(["tenants", "suspend", "ten_cli", "--reason", "abuse report 42"]);
    expect(suspended.code, suspended.err).toBe(0);
    expect(suspended.out).toBe(`ten_cli suspended; hibernated 1 agent(s): ${agent.id}\n`);
    const shown = await agentvm(["tenants", "show", "ten_cli"]);
    expect(shown.out).toMatch(/^status\s+suspended$/m);
    expect(shown.out).toMatch(/^reason\s+abuse report 42$/m);
    expect(json<{ tenants: { id: string }[] }>(await agentvm(["tenants", "ls", "--status", "suspended", "--json"])).tenants.map((t) => t.id)).toEqual([
      "ten_cli",
    ]);
    // The tenant's own CLI now says why.
    const refused = await agentvm(["agents", "ls"], tenantToken);
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/^error tenant_suspended: tenant ten_cli is suspended: abuse report 42 \(request req_\w+\)$/m);

    const resumed = await agentvm(["tenants", "resume", "ten_cli"]);
    expect(resumed.out).toBe("ten_cli active\n");
    expect((await agentvm(["agents", "ls"], tenantToken)).code).toBe(0);

    const removed = await agentvm(["tenants", "rm", "ten_cli"]);
    expect(removed.code, removed.err).toBe(0);
    expect(removed.out).toBe(`ten_cli deleted; destroyed 1 agent(s): ${agent.id}\n`);
    expect(json<{ status: string }>(await agentvm(["tenants", "show", "ten_cli", "--json"])).status).toBe("deleted");
    const missing = await agentvm(["tenants", "show", "ten_nosuch"]);
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/^error not_found: tenant ten_nosuch not found/m);
  }, 60_000);

  it("a tenant token is refused the operator commands; whoami (and bare `tenants`) read the token's claims", async () => {
    const refused = await agentvm(["tenants", "ls"], cli.sys.demo.token);
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/^error forbidden: token lacks the operator scope/m);
    for (const args of [["tenants", "whoami"], ["tenants"], ["tenants", "show"]]) {
      const who = await agentvm(args, cli.sys.demo.token);
      expect(who.code, who.err).toBe(0);
      expect(who.out).toMatch(new RegExp(`^tenant\\s+${cli.sys.demo.tenantId}$`, "m"));
      expect(who.out).toMatch(/^scopes\s+agents:invoke agents:admin agents:exec images:read images:write usage:read$/m);
    }
    expect((await agentvm(["tenants", "whoami"])).out).toMatch(/^scopes\s+operator$/m);
  });

  it("agentvm token --operator mints an operator-only token the gateway takes; the default scopes never include operator", async () => {
    const minted = await agentvm(["token", "--operator", "--data-dir", cli.sys.dataDir]);
    expect(minted.code, minted.err).toBe(0);
    const token = minted.out.trim();
    expect((await agentvm(["tenants", "whoami"], token)).out).toMatch(/^tenant\s+ten_operator$/m);
    expect(json<{ tenants: unknown[] }>(await agentvm(["tenants", "ls", "--json"], token)).tenants.length).toBeGreaterThan(0);
    const plain = (await agentvm(["token", "--tenant", cli.sys.demo.tenantId, "--data-dir", cli.sys.dataDir])).out.trim();
    expect((await agentvm(["tenants", "whoami"], plain)).out).toMatch(
      /^scopes\s+agents:invoke agents:admin agents:exec desktop:control images:read images:write usage:read$/m,
    );
    expect((await agentvm(["tenants", "ls"], plain)).code).toBe(1);
    const noTenant = await agentvm(["token", "--data-dir", cli.sys.dataDir]);
    expect(noTenant.code).toBe(2);
  });
});
