// Templates through the real system (Postgres, HTTP, the host) over a driver that lists templates: GET /v1/templates for the operator only, the CLI, and a clone's wake recorded in its running event.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { and, eq } from "drizzle-orm";
import { vmEvents } from "../../schema/core.ts";
import { mintToken } from "../../compose/dev-keys.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { runAgentvm, type CliRun } from "../helpers/cli.ts";
import { FakeTemplateDriver, failedTemplate, readyTemplate } from "../helpers/fake-template-driver.ts";

let sys: TestSystem;
let driver: FakeTemplateDriver;
let home: string;

/** `agentvm …` against the system, with the operator token unless `token` says. */
const agentvm = (args: string[], token?: string): Promise<CliRun> => runAgentvm(args, { url: sys.url, token: token ?? sys.operatorToken, home });

beforeAll(async () => {
  driver = new FakeTemplateDriver();
  sys = await startSystem({ driver });
  home = mkdtempSync(join(tmpdir(), "agentvm-cli-templates-home-"));
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

describe("GET /v1/templates", () => {
  it("answers the operator this host's templates with its id, never the template's directory", async () => {
    driver.templates = [readyTemplate, failedTemplate];
    const res = await sys.call("/v1/templates", { token: sys.operatorToken });
    expect(res.status, await res.clone().text()).toBe(200);
    const body = (await res.json()) as { templates: Record<string, unknown>[] };
    const { dir: _dir, ...ready } = readyTemplate;
    expect(body.templates).toEqual([
      { ...ready, hostId: sys.host.hostId },
      { ...failedTemplate, hostId: sys.host.hostId },
    ]);
    expect(JSON.stringify(body)).not.toContain("/var/lib/agentvm");
  });

  it("is an empty list when the driver keeps none", async () => {
    driver.templates = [];
    const res = await sys.call("/v1/templates", { token: sys.operatorToken });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ templates: [] });
  });

  it("refuses a tenant's token (403, even with every tenant scope) and no token (401); the operator's tenant claim need not exist", async () => {
    driver.templates = [readyTemplate];
    const tenant = await sys.call("/v1/templates");
    expect(tenant.status).toBe(403);
    expect(((await tenant.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: "forbidden",
      message: expect.stringContaining("operator"),
    });
    expect((await sys.call("/v1/templates", { token: "" })).status).toBe(401);
    // An operator token whose tenant exists nowhere: the operator's routes skip the tenant check (this path among them).
    const stranger = await mintToken(sys.keys.privateJwk, { tenant: "ten_nowhere_at_all", scopes: ["operator"] });
    expect((await sys.call("/v1/templates", { token: stranger })).status).toBe(200);
    // The same token on a tenant's route is refused: the skip is the operator paths', not the scope's.
    expect((await sys.call("/v1/agents", { token: stranger })).status).toBe(403);
  });
});

describe("agentvm templates ls", () => {
  it("prints a table, the API's JSON with --json, and fails for a tenant's token", async () => {
    driver.templates = [readyTemplate, failedTemplate];
    const table = await agentvm(["templates", "ls"]);
    expect(table.code, table.err).toBe(0);
    const lines = table.out.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^HOST\s+KEY\s+IMAGE\s+STATE\s+VCPUS\s+MEM MIB\s+EGRESS\s+BOOT\s+BYTES\s+CREATED\s+ERROR$/);
    expect(lines[1]).toMatch(
      new RegExp(`^${sys.host.hostId}\\s+0a1b2c3d4e5f6071\\s+demo\\s+ready\\s+1\\s+256\\s+no\\s+2412 ms\\s+268500000\\s+2026-12-01 10:00:00Z$`),
    );
    expect(lines[2]).toMatch(
      new RegExp(`^${sys.host.hostId}\\s+ffee000000000001\\s+demo\\s+failed\\s+2\\s+512\\s+yes\\s+boot_failed: the workload never answered$`),
    );

    const json = await agentvm(["templates", "ls", "--json"]);
    expect(json.code, json.err).toBe(0);
    const parsed = JSON.parse(json.out) as { templates: { key: string; hostId: string }[] };
    expect(parsed.templates.map((t) => [t.hostId, t.key])).toEqual([
      [sys.host.hostId, readyTemplate.key],
      [sys.host.hostId, failedTemplate.key],
    ]);

    const refused = await agentvm(["templates", "ls"], sys.demo.token);
    expect(refused.code).toBe(1);
    expect(refused.err).toMatch(/^error forbidden: .*operator/m);
  }, 60_000);
});

describe("a clone's wake", () => {
  async function runningDetails(agentId: string): Promise<Record<string, unknown>[]> {
    await sys.host.flush();
    const rows = await sys.database.db
      .select()
      .from(vmEvents)
      .where(and(eq(vmEvents.agentId, agentId), eq(vmEvents.toState, "running")));
    return rows.map((r) => r.detail ?? {});
  }

  it("names its template in the running transition's detail; a cold boot names none", async () => {
    driver.cloneOf = readyTemplate.key;
    const clone = await sys.createAgent();
    expect((await sys.call(`/a/${clone.id}/counter`)).status).toBe(200);
    const [cloned] = await runningDetails(clone.id);
    expect(cloned).toMatchObject({ wake: "boot", template: readyTemplate.key });

    driver.cloneOf = undefined;
    const cold = await sys.createAgent();
    expect((await sys.call(`/a/${cold.id}/counter`)).status).toBe(200);
    const [booted] = await runningDetails(cold.id);
    expect(booted).toMatchObject({ wake: "boot" });
    expect(booted).not.toHaveProperty("template");
  });
});
