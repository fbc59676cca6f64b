// Every configuration variable is defined once, in one fragment; the programs' schemas are made of them; invalid values fail naming the variable.
import { describe, expect, it } from "vitest";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { envDocOf } from "../../lib/env.ts";
import { fragments, programs } from "../../compose/config/programs.ts";
import { parseAllInOneConfig } from "../../compose/all-in-one.ts";
import { parseStandaloneGatewayConfig } from "../../compose/standalone-gateway.ts";
import { fleetAgentDaemonEnv, parseDaemonConfig } from "../../compose/fleet-agent.ts";
import { parseWorkerEnv } from "../../compose/worker-env.ts";
import { parseEnv } from "../../lib/env.ts";

const root = join(import.meta.dirname, "..", "..");
const secret = "test-component-secret-0123456789abcdef";

function definitions(): Map<string, string[]> {
  const where = new Map<string, string[]>();
  for (const [fragment, schema] of Object.entries(fragments)) {
    for (const name of Object.keys(schema.shape)) where.set(name, [...(where.get(name) ?? []), fragment]);
  }
  return where;
}

function sources(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (entry.isDirectory()) out.push(...sources(join(dir, entry.name)));
    else if (entry.name.endsWith(".ts")) out.push(join(dir, entry.name));
  }
  return out;
}

describe("the configuration schemas", () => {
  it("define every variable exactly once, in one fragment", () => {
    const twice = [...definitions()].filter(([, where]) => where.length > 1);
    expect(twice).toEqual([]);
  });

  it("make every program's schema of fragments' variables, each documented", () => {
    const defined = definitions();
    for (const p of programs) {
      for (const [name, schema] of Object.entries(p.schema.shape)) {
        expect(defined.has(name), `${name} of ${p.title} is defined in a fragment`).toBe(true);
        const doc = envDocOf(schema);
        expect(doc?.doc, `${name} has a meaning`).toMatch(/\S/);
        expect(doc?.default, `${name} has a default (or says it has none)`).toMatch(/\S/);
      }
    }
    expect(defined.size).toBeGreaterThan(100);
  });

  it("are the only place the programs' code names a variable (the commands in scripts/ and the CLI read their own)", () => {
    const names = [...definitions().keys()];
    // build-image.ts's text is the guest image's cache key: its reader for the provisioning scripts stays (fleet-agent/guest/kernel-env.ts is the programs').
    // The demo workload's PORT is the one its driver gives the agent, not configuration.
    const allowed = new Set([
      "fleet-agent/guest/build-image.ts:GUEST_KERNEL",
      "fleet-agent/guest/build-image.ts:GUEST_KERNEL_MODULES",
      "fleet-agent/workloads/demo.ts:PORT",
    ]);
    const reads: string[] = [];
    for (const folder of ["lib", "contracts", "schema", "billing", "images", "gateway", "fleet-agent", "compose"]) {
      for (const file of sources(join(root, folder))) {
        const text = readFileSync(file, "utf8");
        const path = relative(root, file);
        for (const name of names) {
          if (new RegExp(`env\\.${name}\\b|env\\[["']${name}["']\\]|\\(env, ["']${name}["']`).test(text) && !allowed.has(`${path}:${name}`))
            reads.push(`${path} reads ${name}`);
        }
      }
    }
    expect(reads).toEqual([]);
  });

  it("keep the defaults and the readers' rules: empty is unset, booleans 1|true|yes|on, one upstream connect timeout", () => {
    const c = parseAllInOneConfig({ PORT: "", PROXY_FAST_PATH: "OFF", TENANTS_AUTO_PROVISION: "Yes" }, ["demo"]);
    expect(c.port).toBe(8080);
    expect(c.gateway.proxy?.fastPath).toBe(false);
    expect(c.gateway.tenants?.autoProvision).toBe(true);
    expect(c.gateway.proxy?.connectTimeoutMs).toBe(5000);
    expect(c.fleet.upstream.connectTimeoutMs).toBe(5000);
    expect(c.dbAppRole).toBe("agentvm_app");
    expect(parseAllInOneConfig({ DATABASE_APP_ROLE: "" }, ["demo"]).dbAppRole).toBe("");
    const prestart = (v: string) => parseEnv(fleetAgentDaemonEnv, { DATABASE_URL: "postgres://x", COMPONENT_SECRET: secret, QEMU_PRESTART: v }).QEMU_PRESTART;
    expect([prestart("paused"), prestart("PAUSED"), prestart("1"), prestart("0"), prestart("")]).toEqual(["paused", "paused", true, false, "paused"]);
  });

  it("refuse invalid values at start, naming the variable and what is wrong", () => {
    const allInOne = (env: Record<string, string>) => () => parseAllInOneConfig(env, ["demo"]);
    expect(allInOne({ PORT: "http" })).toThrow(/PORT must be an integer, got "http"/);
    expect(allInOne({ AGENT_VCPUS: "17" })).toThrow(/AGENT_VCPUS must be ≤ 16, got 17/);
    expect(allInOne({ UPSTREAM_CONNECT_TIMEOUT_MS: "10" })).toThrow(/UPSTREAM_CONNECT_TIMEOUT_MS must be ≥ 100, got 10/);
    expect(allInOne({ PROXY_FAST_PATH: "maybe" })).toThrow(/PROXY_FAST_PATH must be true or false, got "maybe"/);
    expect(allInOne({ DRIVER: "kvm" })).toThrow(/DRIVER must be one of auto\|qemu\|process\|firecracker, got "kvm"/);
    expect(allInOne({ QEMU_PRESTART: "sometimes" })).toThrow(/QEMU_PRESTART must be true or false/);
    expect(allInOne({ COMPONENT_SECRET: "short" })).toThrow(/COMPONENT_SECRET must be at least 32 characters/);
    expect(allInOne({ EGRESS_ALLOW: "nope" })).toThrow(/EGRESS_ALLOW/);
    expect(allInOne({ WEBHOOK_LEASE_MS: "1000", WEBHOOK_ATTEMPT_TIMEOUT_MS: "5000" })).toThrow(
      /WEBHOOK_LEASE_MS \(1000\) must exceed WEBHOOK_ATTEMPT_TIMEOUT_MS/,
    );
    // Every refused variable in the one error.
    expect(allInOne({ PORT: "x", CPU_BUSY_PERCENT: "0" })).toThrow(/PORT must be an integer.*; CPU_BUSY_PERCENT must be ≥ 1/);
    expect(() => parseDaemonConfig({ COMPONENT_SECRET: secret })).toThrow(/DATABASE_URL is required/);
    expect(() => parseStandaloneGatewayConfig({ DATABASE_URL: "postgres://x" })).toThrow(/COMPONENT_SECRET is required/);
    expect(() => parseDaemonConfig({ DATABASE_URL: "postgres://x", COMPONENT_SECRET: secret, HOST_CAPACITY_MIB: "10" })).toThrow(
      /HOST_CAPACITY_MIB must be ≥ 64/,
    );
  });

  it("give the Worker every problem at once, without throwing", () => {
    const parsed = parseWorkerEnv({ MAX_BODY_BYTES: "lots" });
    expect(parsed.ok).toBe(false);
    const problems = parsed.ok ? [] : parsed.problems.join("\n");
    expect(problems).toMatch(/HYPERDRIVE/);
    expect(problems).toMatch(/COMPONENT_SECRET is required/);
    expect(problems).toMatch(/MAX_BODY_BYTES must be an integer/);
    expect(problems).toMatch(/JWKS_URL or JWKS_JSON is missing/);
    const ok = parseWorkerEnv({
      HYPERDRIVE: { connectionString: "postgres://x" },
      COMPONENT_SECRET: secret,
      JWKS_URL: "https://issuer.example/jwks",
      AGENT_IMAGES: "a, b",
      DB_MAX_CONNECTIONS: 3,
    });
    expect(ok.ok && { images: ok.config.gateway.images, db: ok.config.dbMaxConnections, keys: ok.config.keys }).toEqual({
      images: ["a", "b"],
      db: 3,
      keys: { jwksUrl: "https://issuer.example/jwks" },
    });
  });
});
