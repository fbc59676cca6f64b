// The dashboard end to end: a real system (process driver, real Postgres, real sockets) serving the built dashboard,
// driven in headless Chromium: sign in, see the demo agent wake after a call, see its run with its wake timing, a non-blank screenshot.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Page } from "playwright-core";
import { ensureDashboard } from "../../scripts/build-dashboard.ts";
import { hasChromium, launchChromium, type Browser } from "../helpers/chromium.ts";
import { decodePng, distinctColors } from "../helpers/png.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";
import { operations } from "../../schema/operations.ts";
import { agents, pools } from "../../schema/core.ts";
import { eq } from "drizzle-orm";

// In CI the provisioning installs chromium, so a missing one fails the test instead of skipping it.
const runnable = hasChromium() || process.env.CI === "true";
if (!runnable) console.log("dashboard.test.ts skipped: no /usr/bin/chromium (npm test installs Debian's chromium when run as root)");

describe.runIf(runnable)("the dashboard in headless Chromium", () => {
  let sys: TestSystem;
  let browser: Browser;
  let page: Page;
  const pageErrors: string[] = [];
  const shots = mkdtempSync(join(tmpdir(), "agentvm-dashboard-shots-"));

  beforeAll(async () => {
    await ensureDashboard();
    // Meter segments every half second: the run's active time reaches billing, and so the plots, while the test looks.
    sys = await startSystem({ env: { METER_HEARTBEAT_MS: "500" } });
    browser = await launchChromium();
    page = await browser.context.newPage();
    page.on("pageerror", (err) => pageErrors.push(err.message));
    page.on("console", (msg) => {
      if (msg.type() === "error") pageErrors.push(msg.text());
    });
  });
  afterAll(async () => {
    await browser?.close();
    await sys?.stop();
    rmSync(shots, { recursive: true, force: true });
  });

  it("serves its files without a token: index.html for client routes, content types, nothing outside the build", async () => {
    const root = await fetch(`${sys.url}/`, { redirect: "manual" });
    expect(root.status).toBe(302);
    expect(root.headers.get("location")).toBe("/dashboard/");

    const index = await fetch(`${sys.url}/dashboard/`);
    expect(index.status).toBe(200);
    expect(index.headers.get("content-type")).toBe("text/html; charset=utf-8");
    expect(index.headers.get("content-security-policy")).toContain("script-src 'self'");
    const html = await index.text();
    const script = /src="(\/dashboard\/app-[A-Z0-9]+\.js)"/.exec(html)?.[1];
    const style = /href="(\/dashboard\/style-[A-Z0-9]+\.css)"/.exec(html)?.[1];
    expect(script && style).toBeTruthy();

    const js = await fetch(sys.url + script);
    expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
    expect(js.headers.get("cache-control")).toContain("immutable");
    expect((await js.text()).length).toBeGreaterThan(1000);
    expect((await fetch(sys.url + style)).headers.get("content-type")).toBe("text/css; charset=utf-8");

    const route = await fetch(`${sys.url}/dashboard/agents/agt_demo`);
    expect(route.status).toBe(200);
    expect(await route.text()).toBe(html);

    for (const path of ["/dashboard/.build-stamp.json", "/dashboard/%2e%2e/package.json", "/dashboard/..%2fpackage.json", "/dashboard/missing.js"]) {
      const res = await fetch(sys.url + path);
      expect(res.status, path).toBe(404);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("not_found");
    }
    // the API keeps answering its own paths with its envelope
    expect((await fetch(`${sys.url}/v1/agents`)).status).toBe(401);
  });

  it("signs in, shows the demo agent waking after a call and its run with the wake's timing", async () => {
    const agentId = sys.demo.agentId;
    await page.goto(`${sys.url}/dashboard/`);
    await page.waitForURL(/\/dashboard\/signin$/);

    // A wrong token: the page shows what the API said of it.
    const refused = await sys.call("/v1/agents", { token: "not-a-token" });
    const refusal = ((await refused.json()) as { error: { message: string } }).error.message;
    await page.fill("#token", "not-a-token");
    await page.click("button[type=submit]");
    expect(await page.locator("[data-testid=signin-error]").textContent()).toBe(refusal);

    await page.fill("#token", sys.demo.token);
    await page.click("button[type=submit]");
    const row = page.locator(`tr[data-agent-id="${agentId}"]`);
    await row.waitFor();
    expect(await row.locator("[data-testid=agent-state]").textContent()).not.toBe("running");
    expect(await page.evaluate(() => sessionStorage.getItem("agentvm.token"))).toBe(sys.demo.token);
    pageErrors.length = 0; // the refused token's 401 is the one error the browser logged so far, on purpose

    // A call wakes the agent; the list (refreshed every few seconds) shows it running.
    const call = await sys.call(`/a/${agentId}/counter`, { method: "POST" });
    expect(call.status).toBe(200);
    await row.locator("[data-testid=agent-state]", { hasText: /^running$/ }).waitFor({ timeout: 15_000 });
    expect(await row.locator("td").nth(2).textContent()).not.toBe("never");

    // Its page: the run the call started, what woke it and how long the boot took.
    await row.locator("a").first().click();
    await page.waitForURL(new RegExp(`/dashboard/agents/${agentId}$`));
    const run = page.locator("[data-testid=run]").first();
    await run.waitFor({ timeout: 20_000 });
    const api = (await (await sys.call(`/v1/agents/${agentId}/runs`)).json()) as {
      runs: { runId: string; wakeReason: string; wakeMode: string; timings: { bootMs?: number; restoreMs?: number } }[];
    };
    const first = api.runs[0]!;
    expect(await run.getAttribute("data-run-id")).toBe(first.runId);
    const cells = await run.locator("td").allTextContents();
    expect(cells[1]).toBe(first.wakeReason);
    expect(cells[2]).toBe(first.wakeMode);
    const wakeCell = run.locator(`[data-timing=${first.wakeMode === "restore" ? "restoreMs" : "bootMs"}]`);
    expect(await wakeCell.textContent()).toMatch(/^\d+(\.\d)? (ms|s)$/);
    expect(first.timings.bootMs ?? first.timings.restoreMs).toBeGreaterThan(0);
    // Its last operations: a call through an upstream during the run, as a host records it, listed with its model,
    // tokens and duration; the run's row counts it and its wait for the first byte.
    const sentAt = new Date(Date.now() - 2000);
    await sys.database.db.insert(operations).values({
      id: "op_dashboard00001",
      tenantId: sys.demo.tenantId,
      agentId,
      runId: first.runId,
      hostId: "host_x",
      upstream: "openai",
      method: "POST",
      path: "/v1/chat/completions",
      requestHash: "0".repeat(64),
      mode: "sync",
      state: "succeeded",
      status: 200,
      sentAt,
      firstByteAt: new Date(sentAt.getTime() + 700),
      endedAt: new Date(sentAt.getTime() + 1500),
      model: "gpt-test",
      inputTokens: 5,
      outputTokens: 7,
    });
    const op = page.locator("[data-testid=operation]").first();
    await op.waitFor({ timeout: 10_000 });
    expect(await op.getAttribute("data-operation-id")).toBe("op_dashboard00001");
    const opCells = await op.locator("td").allTextContents();
    expect(opCells.slice(1)).toEqual(["openai", "POST /v1/chat/completions", "200", "gpt-test", "5 · 7", "1.5 s"]);
    const runOps = page.locator(`[data-run-id="${first.runId}"] [data-testid=run-operations]`);
    await runOps.filter({ hasText: "1 · waited 700 ms" }).waitFor({ timeout: 10_000 });
    expect(await runOps.getAttribute("title")).toBe("tokens in 5, out 7");
    // Its metered time as a bar of this hour (the usage plot refreshes every 10 s), and its cost beside it.
    await page.locator("[data-testid=plot-active] rect.bar").first().waitFor({ timeout: 25_000 });
    expect(await page.locator("[data-testid=plot-active] rect.bar title").first().textContent()).toMatch(/: \d+(\.\d+)? s$/);
    expect(await page.locator("[data-testid=plot-cost] rect.bar").count()).toBeGreaterThan(0);

    const shot = join(shots, "agent.png");
    await page.screenshot({ path: shot, fullPage: true });
    const pixels = decodePng(readFileSync(shot));
    expect(pixels.width).toBeGreaterThan(600);
    // A blank page is one colour; text, badges, the table and the plot make hundreds.
    expect(distinctColors(pixels)).toBeGreaterThan(50);
    expect(pageErrors).toEqual([]);
  });

  it("shows the month's usage plot and the invoice preview with its total", async () => {
    await page.click("nav >> text=Usage");
    await page.waitForURL(/\/dashboard\/usage$/);
    const month = new Date().toISOString().slice(0, 7);
    const invoice = (await (await sys.call(`/v1/invoices?month=${month}`)).json()) as { total: string; currency: string };
    expect(invoice.total).toMatch(/^\d+\.\d{2}$/);
    // the draft is recomputed at each load: the page shows the API's total (at its next refresh if usage moved it meanwhile)
    await page.locator("[data-testid=invoice-total]", { hasText: `${invoice.total} ${invoice.currency}` }).waitFor({ timeout: 15_000 });
    await page.locator("[data-testid=plot-active] rect.bar").first().waitFor();
    await page.locator(`[data-testid=invoice] tbody a[href="/dashboard/agents/${sys.demo.agentId}"]`).first().waitFor({ timeout: 15_000 });
    expect(pageErrors).toEqual([]);
  });

  it("shows the tenant's pools with their counts, and the pool an agent is in", async () => {
    // The process driver keeps no checkpoints: the pool's row and its member are written as the pools API would leave them.
    const poolId = "pol_dashboardtest01";
    await sys.database.db
      .insert(pools)
      .values({ id: poolId, tenantId: sys.demo.tenantId, name: "episodes", fromCheckpoint: "ckp_dashboardtest01", size: 2, maxSize: 4 });
    const { id: member } = await sys.createAgent({ name: "pooled" });
    await sys.database.db.update(agents).set({ poolId, poolState: "in_use", poolAcquiredAt: new Date() }).where(eq(agents.id, member));
    await page.click("nav >> text=Pools");
    await page.waitForURL(/\/dashboard\/pools$/);
    const row = page.locator(`tr[data-pool-id="${poolId}"]`);
    await row.waitFor({ timeout: 15_000 });
    expect(await row.locator("[data-testid=pool-in-use]").textContent()).toBe("1");
    expect(await row.locator("[data-testid=pool-ready]").textContent()).toBe("0");
    expect(await row.locator("td").first().textContent()).toContain("episodes");
    await page.click("nav >> text=Agents");
    await page.locator(`tr[data-agent-id="${member}"] [data-testid=agent-pool]`, { hasText: `pool ${poolId} · in use` }).waitFor({ timeout: 15_000 });
    expect(pageErrors).toEqual([]);
  });
});
