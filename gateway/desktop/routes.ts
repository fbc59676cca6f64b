// A desktop agent's screen over the API (`/v1/agents/{id}/desktop/screenshot|actions`, and the viewer's `…/vnc` from vnc.ts): scope agents:exec, actions in the audit log.
//
// Both run the desktop helper in the VM through the exec path (helper.ts): the agent is woken as a call wakes it (a
// hibernated desktop comes back as it was) and held awake while the helper runs. While a human holds control through
// the viewer, actions are refused (409). Docs: docs/desktop.md.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import type { Context } from "hono";
import { apiRouter, errors, json, jsonBody, jsonRequest, z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import type { AgentSpec, DesktopSize } from "../../contracts/agent.ts";
import { callerAction } from "../../schema/audit-log.ts";
import type { GatewayDeps } from "../deps.ts";
import type { ProxyCore } from "../proxy/core.ts";
import { ActionsBody, ActionsResultSchema, AgentParams, maxBatchWaitMs, ScreenshotQuery, type DesktopActionInput } from "./api-schemas.ts";
import { runHelper } from "./helper.ts";
import { parseKeys } from "./keys.ts";
import { controlHolder, memoryDesktopSessions } from "./sessions.ts";
import { desktopVncRoutes } from "./vnc.ts";

export type DesktopRouteDeps = Pick<GatewayDeps, "fleet" | "audit" | "log" | "config" | "desktopSessions">;

const tags = ["desktop"];
const gate = scopeGate("agents:exec");
/** The helper's own limit for a screenshot, ms (TCG's slowest seen is far below). */
const screenshotTimeoutMs = 30_000;
/** A batch's limit beyond its waits, ms. */
const batchMarginMs = 60_000;

const screenshotRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/desktop/screenshot",
  operationId: "desktopScreenshot",
  summary: "The agent's screen as a PNG (waking it: a hibernated desktop comes back as it was)",
  description:
    "The whole display, `scale` times its size (nearest pixel). `x-desktop-width` and `x-desktop-height` give the display's own size, `x-wake` the wake the call caused. `409 no_desktop` for an agent whose image has no desktop.",
  tags,
  middleware: [gate],
  request: { params: AgentParams, query: ScreenshotQuery },
  responses: {
    200: { description: "The screen", content: { "image/png": { schema: z.string().openapi({ format: "binary" }) } } },
    ...errors(400, 404, 409, 501, 502, 504),
  },
});

const actionsRoute = (body: ReturnType<typeof jsonBody>) =>
  createRoute({
    method: "post",
    path: "/v1/agents/{id}/desktop/actions",
    operationId: "desktopActions",
    summary: "Act on the agent's screen: move, click, drag, scroll, type, keys, wait (waking it); answers the cursor and the screen after the last action",
    description:
      "At most 50 actions, run in order; coordinates must be on the agent's display and keys known (else 400 before anything runs). The answer has the cursor and, unless `screenshot: false`, the screen after the last action as a base64 PNG. Recorded in the audit log as `agent.desktop.actions` (the actions' types and the number of characters typed, never the text).",
    tags,
    middleware: [gate, body],
    request: { params: AgentParams, ...jsonRequest(ActionsBody) },
    responses: { 200: json(ActionsResultSchema, "Done"), ...errors(400, 404, 409, 413, 501, 502, 504) },
  });

export function desktopRoutes(deps: DesktopRouteDeps, proxy: Pick<ProxyCore, "resolve">): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const body = jsonBody(() => deps.config.maxApiBodyBytes);
  const sessions = deps.desktopSessions ?? memoryDesktopSessions();
  r.route("/", desktopVncRoutes(deps, proxy, sessions));

  /** The caller's agent (404 for another tenant's) and its display: `no_desktop` before anything wakes it when it has none. */
  async function target(c: Context<GatewayEnv>, id: string): Promise<{ caller: Caller; spec: AgentSpec; size: DesktopSize }> {
    const caller = requireScope(c, "agents:exec");
    const agent = await proxy.resolve(id);
    if (agent.row.tenantId !== caller.tenantId) throw new AppError("not_found", `agent ${id} not found`);
    const size = agent.row.desktop;
    if (!size) throw new AppError("no_desktop", `agent ${id} has no desktop: its image is not built FROM agentvm/desktop:bookworm`);
    return { caller, spec: agent.spec, size };
  }

  r.openapi(screenshotRoute, async (c) => {
    const { id } = c.req.valid("param");
    const { scale } = c.req.valid("query");
    const { spec, size } = await target(c, id);
    const { stdout, wake } = await runHelper(deps.fleet, spec, {
      request: { cmd: "screenshot", ...(scale !== undefined && scale < 1 ? { scale } : {}) },
      requestId: c.get("requestId"),
      signal: c.req.raw.signal,
      timeoutMs: screenshotTimeoutMs,
    });
    if (!isPng(stdout)) throw new AppError("bad_gateway", `agent ${id}'s desktop helper answered something other than a PNG`);
    return new Response(stdout as Uint8Array<ArrayBuffer>, {
      status: 200,
      headers: {
        "content-type": "image/png",
        "cache-control": "no-store",
        "x-desktop-width": String(size.width),
        "x-desktop-height": String(size.height),
        ...(wake ? { "x-wake": wake } : {}),
      },
    }) as never;
  });

  r.openapi(actionsRoute(body), async (c) => {
    const { id } = c.req.valid("param");
    const q = c.req.valid("json");
    const { caller, spec, size } = await target(c, id);
    const actions = checkActions(q.actions, size);
    const holder = await controlHolder(sessions, spec.id, new Date());
    if (holder)
      throw new AppError(
        "conflict",
        `a human (${holder.actor}) holds control of agent ${id}'s desktop since ${holder.startedAt.toISOString()}: actions wait until they give it back`,
      );
    const waits = actions.reduce((n, a) => n + (a.type === "wait" ? a.ms : 0), 0);
    const shot = q.screenshot ?? true;
    const scale = q.scale ?? 1;
    const started = Date.now();
    const detail = {
      count: actions.length,
      types: actions.map((a) => a.type),
      typedChars: actions.reduce((n, a) => n + (a.type === "type" ? a.text.length : 0), 0),
    };
    let answer: Awaited<ReturnType<typeof runHelper>>;
    try {
      answer = await runHelper(deps.fleet, spec, {
        request: { cmd: "actions", actions, screenshot: shot, ...(scale < 1 ? { scale } : {}) },
        requestId: c.get("requestId"),
        signal: c.req.raw.signal,
        timeoutMs: waits + batchMarginMs,
      });
    } catch (err) {
      await audit(c, caller, spec.id, { ...detail, ms: Date.now() - started, error: err instanceof Error ? err.message.slice(0, 300) : String(err) });
      throw err;
    }
    let out: { cursor?: { x?: unknown; y?: unknown }; screenshot?: unknown };
    try {
      out = JSON.parse(new TextDecoder().decode(answer.stdout)) as typeof out;
    } catch (err) {
      throw new AppError("bad_gateway", `agent ${id}'s desktop helper answered JSON that does not parse`, { cause: err });
    }
    const x = out.cursor?.x;
    const y = out.cursor?.y;
    if (typeof x !== "number" || typeof y !== "number") throw new AppError("bad_gateway", `agent ${id}'s desktop helper answered no cursor`);
    const durationMs = Date.now() - started;
    await audit(c, caller, spec.id, { ...detail, ms: durationMs });
    return c.json(
      { cursor: { x, y }, display: size, screenshot: typeof out.screenshot === "string" ? out.screenshot : null, durationMs },
      200,
      answer.wake ? { "x-wake": answer.wake } : {},
    );
  });

  /** Records the batch; a failure to record is logged, never the caller's (the actions ran). */
  function audit(c: Context<GatewayEnv>, caller: Caller, agentId: string, detail: Record<string, unknown>): Promise<void> {
    return deps.audit.record(callerAction(caller, c.get("requestId"), "agent.desktop.actions", agentId, detail)).catch((err: unknown) => {
      deps.log.error("audit record failed", {
        requestId: c.get("requestId"),
        action: "agent.desktop.actions",
        agentId,
        err: err instanceof Error ? err.message : String(err),
      });
    });
  }

  return r;
}

/**
 * The batch as the helper takes it, checked against the display before anything runs: every coordinate on the
 * screen, every key known (its xdotool name substituted), the waits within `maxBatchWaitMs` together. 400 naming the
 * first action at fault.
 */
export function checkActions(actions: readonly DesktopActionInput[], size: DesktopSize): DesktopActionInput[] {
  let waits = 0;
  return actions.map((a, i) => {
    const on = (x: number | undefined, y: number | undefined, what = "") => {
      if (x === undefined && y === undefined) return;
      if (x === undefined || y === undefined) throw new AppError("bad_request", `actions[${i}]: ${a.type} needs both ${what}x and ${what}y, or neither`);
      if (x >= size.width || y >= size.height)
        throw new AppError("bad_request", `actions[${i}]: ${a.type} at (${x}, ${y}) is off the ${size.width}x${size.height} screen`);
    };
    switch (a.type) {
      case "drag":
        on(a.startX, a.startY, "start");
        on(a.x, a.y);
        return a;
      case "key": {
        const parsed = parseKeys(a.keys);
        if ("error" in parsed) throw new AppError("bad_request", `actions[${i}]: ${parsed.error}`);
        return { ...a, keys: parsed.keys };
      }
      case "wait":
        waits += a.ms;
        if (waits > maxBatchWaitMs) throw new AppError("bad_request", `actions[${i}]: the batch's waits pass ${maxBatchWaitMs} ms`);
        return a;
      case "type":
        return a;
      default:
        on(a.x, a.y);
        return a;
    }
  });
}

function isPng(bytes: Uint8Array): boolean {
  const sig = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];
  return bytes.byteLength > 8 && sig.every((b, i) => bytes[i] === b);
}
