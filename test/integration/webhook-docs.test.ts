// The curl + openssl examples of docs/webhooks.md, run with bash against a real server on loopback.
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { serve } from "@hono/node-server";
import { eq } from "drizzle-orm";
import { systemClock } from "../../lib/clock.ts";
import { silentLogger } from "../../lib/log.ts";
import { webhookDeliveries } from "../../schema/webhooks.ts";
import { createWebhookRoutes } from "../../gateway/webhooks/routes.ts";
import { defaultWebhookConfig } from "../../gateway/webhooks/types.ts";
import { freshDatabase } from "../helpers/db.ts";
import { caller, seedAgent, withTestAuth } from "../helpers/webhook-fixtures.ts";

const docs = readFileSync(fileURLToPath(new URL("../../docs/webhooks.md", import.meta.url)), "utf8");

/** The fenced bash block that follows `<!-- webhook-example: name … -->`. */
function example(name: string): string {
  const m = new RegExp(`<!-- webhook-example: ${name}\\b[^>]*-->\\s*\`\`\`bash\\n([\\s\\S]*?)\\n\`\`\``).exec(docs);
  if (!m?.[1]) throw new Error(`docs/webhooks.md has no "${name}" example`);
  return m[1];
}

function runBash(script: string, env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    // --norc: with a socket on stdin (how Node wires a child's stdio) bash would otherwise read ~/.bashrc.
    execFile(
      "bash",
      ["--noprofile", "--norc", "-c", `set -euo pipefail\n${script}`],
      { env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env }, timeout: 30_000 },
      (err, stdout, stderr) => {
        resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
      },
    );
  });
}

let database: Awaited<ReturnType<typeof freshDatabase>>;
let server: ReturnType<typeof serve>;
let env: Record<string, string>;

beforeAll(async () => {
  database = await freshDatabase();
  const agent = await seedAgent(database.db);
  const routes = createWebhookRoutes({
    db: database.db,
    clock: systemClock,
    log: silentLogger,
    forward: () => Promise.reject(new Error("unused")),
    config: defaultWebhookConfig,
  });
  const app = withTestAuth(routes, { "docs-token": caller(agent.tenantId) });
  await new Promise<void>((resolve) => {
    server = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" }, () => resolve());
  });
  env = { GATEWAY: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, TOKEN: "docs-token", AGENT_ID: agent.agentId };
});
afterAll(async () => {
  await new Promise<void>((r) => server?.close(() => r()));
  await database?.close();
});

async function storedBody(stdout: string): Promise<string> {
  const m = /\{"deliveryId":"(dlv_[0-9a-z]+)"\}/.exec(stdout);
  expect(m, stdout).not.toBeNull();
  const [row] = await database.db.select().from(webhookDeliveries).where(eq(webhookDeliveries.id, m![1]!));
  return Buffer.from(row!.body).toString();
}

describe("the examples of docs/webhooks.md", () => {
  it("the Standard Webhooks example creates an endpoint and its openssl-signed webhook is accepted (202)", async () => {
    const { code, stdout, stderr } = await runBash(example("standard"), env);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await storedBody(stdout)).toBe('{"type":"order.paid","order":42}');
  });

  it("the GitHub example is accepted too", async () => {
    const { code, stdout, stderr } = await runBash(example("github"), env);
    expect(stderr).toBe("");
    expect(code).toBe(0);
    expect(await storedBody(stdout)).toBe('{"zen":"Design for failure."}');
  });

  it("a wrong secret in the same one-liner is refused, so the example really is what verifies", async () => {
    const tampered = example("standard")
      .replace('"${SECRET#whsec_}"', '"c2VjcmV0LW5vdC1pdA=="')
      .replace('"name":"orders"', '"name":"orders-2"')
      .replaceAll('/orders"', '/orders-2"');
    expect(tampered).toContain("c2VjcmV0LW5vdC1pdA==");
    const { code, stdout } = await runBash(tampered, env);
    expect(code).not.toBe(0);
    expect(stdout).toContain('"invalid_signature"');
  });
});
