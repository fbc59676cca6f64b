// A viewer's WebSocket to a desktop agent's VNC server (`GET /v1/agents/{id}/desktop/vnc`): view-only by default, input with `control=true`; a session shared by all gateways, a keep-awake lease while it is open, audited.
//
// Runtime-free, on the same acceptor as exec on a terminal (gateway/exec/tty.ts; the Node gateway takes the upgrade
// in gateway/node/exec-tty.ts). The bytes are RFB both ways: the exec path runs the desktop base's `vnc-bridge` in the
// VM (stdin to x11vnc on the guest's loopback, its answers to stdout), so the agent is woken by the connection and
// held awake while it is open, like any exec. View-only is x11vnc's own (`-viewonly` on its view port): a view
// socket's keys and pointer never reach the display. The session row (sessions.ts) is what the actions API of every
// gateway checks for a holder, and what the agent's page lists; the lease shows the hold in the agent's state.
import { createRoute, type OpenAPIHono } from "@hono/zod-openapi";
import { apiRouter, errors, json, z } from "../../lib/api.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { requireScope, scopeGate, type Caller, type GatewayEnv } from "../../contracts/caller.ts";
import { encodeSpec, frameDecoder, frameType, type Frame } from "../../contracts/exec-wire.ts";
import { callerAction } from "../../schema/audit-log.ts";
import type { GatewayDeps } from "../deps.ts";
import type { ProxyCore } from "../proxy/core.ts";
import { startSocketExec, type SocketExec } from "../exec/socket-exec.ts";
import { acceptorOf, checkHandshake, failSocket, ttyClose, type TtySocket } from "../exec/tty.ts";
import { AgentParams, DesktopViewersSchema } from "./api-schemas.ts";
import { holdForViewer } from "./hold.ts";
import { sessionTtlMs, type DesktopSession, type DesktopSessions } from "./sessions.ts";

/** Where the desktop base installs the bridge (images/desktop/vnc-bridge.sh). */
export const vncBridgePath = "/usr/lib/agentvm/desktop/vnc-bridge";

const VncQuery = z.strictObject(
  {
    control: z
      .enum(["true", "false"], { error: "must be true or false" })
      .optional()
      .openapi({ description: "Take over the keyboard and pointer (needs desktop:control or agents:admin as well); default false: view only" }),
  },
  { error: "takes control only" },
);

const vncRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/desktop/vnc",
  operationId: "desktopVnc",
  summary: "A viewer's WebSocket to the agent's screen (RFB, as noVNC speaks it): view only, or with control=true the keyboard and pointer",
  description: [
    "A WebSocket upgrade (Node gateways; a Worker answers 501), the bearer token in Authorization or, from a browser, offered as the",
    "subprotocol `agentvm.bearer.<token>` beside `binary` (the one the answer selects). Binary messages are RFB both ways (noVNC's",
    "`RFB` class connects to it as it is). The connection wakes the agent and holds it awake while it is open (a keep-awake lease,",
    "counted in the agent's `leases`). `control=true` needs `desktop:control` (or `agents:admin`) as well as `agents:exec`, and one",
    "holder at a time across gateways (409 while another holds it); while it is held the actions API answers 409. Listed by",
    "`GET /v1/agents/{id}/desktop/viewers`. Audited: `agent.desktop.view` when a viewer leaves, `agent.desktop.control` when",
    "control is taken and when it is given back (with how long). Closes 1001 when the agent goes to sleep under it or the gateway stops.",
  ].join(" "),
  tags: ["desktop"],
  middleware: [scopeGate("agents:exec")],
  request: { params: AgentParams, query: VncQuery },
  responses: {
    101: { description: "Switching protocols: the viewer's WebSocket" },
    ...errors(400, 403, 404, 409, 501, 502, 504),
  },
});

const viewersRoute = createRoute({
  method: "get",
  path: "/v1/agents/{id}/desktop/viewers",
  operationId: "desktopViewers",
  summary: "Who is watching the agent's desktop, and who holds control (through any gateway)",
  tags: ["desktop"],
  middleware: [scopeGate("agents:exec")],
  request: { params: AgentParams },
  responses: { 200: json(DesktopViewersSchema, "The viewers connected now, oldest first"), ...errors(400, 404) },
});

/** A takeover needs `desktop:control`, or `agents:admin` (which manages the agent anyway). */
function requireControl(caller: Caller): void {
  if (!caller.scopes.has("desktop:control") && !caller.scopes.has("agents:admin"))
    throw new AppError("forbidden", "token lacks the desktop:control scope (or agents:admin) to take control of a desktop");
}

export function desktopVncRoutes(
  deps: Pick<GatewayDeps, "fleet" | "audit" | "log">,
  proxy: Pick<ProxyCore, "resolve">,
  sessions: DesktopSessions,
): OpenAPIHono<GatewayEnv> {
  const r = apiRouter<GatewayEnv>();
  const { fleet, log } = deps;

  r.openapi(viewersRoute, async (c) => {
    const { id } = c.req.valid("param");
    const caller = requireScope(c, "agents:exec");
    const agent = await proxy.resolve(id);
    if (agent.row.tenantId !== caller.tenantId) throw new AppError("not_found", `agent ${id} not found`);
    const live = await sessions.live(agent.spec.id, new Date());
    return c.json({ viewers: live.map((s) => ({ id: s.id, mode: s.mode, actor: s.actor, since: s.startedAt.toISOString() })) }, 200);
  });

  r.openapi(vncRoute, async (c) => {
    const { id } = c.req.valid("param");
    const wantsControl = c.req.valid("query").control === "true";
    const caller = requireScope(c, "agents:exec");
    if (wantsControl) requireControl(caller);
    const agent = await proxy.resolve(id);
    if (agent.row.tenantId !== caller.tenantId) throw new AppError("not_found", `agent ${id} not found`);
    if (!agent.row.desktop) throw new AppError("no_desktop", `agent ${id} has no desktop: its image is not built FROM agentvm/desktop:bookworm`);
    const acceptor = acceptorOf(c);
    checkHandshake(c, acceptor);
    const requestId = c.get("requestId");
    const mode = wantsControl ? "control" : "view";
    const agentId = agent.spec.id;
    const startedAt = new Date();
    const opened = await sessions.open({
      id: newId("desktopSession"),
      tenantId: caller.tenantId,
      agentId,
      mode,
      actor: caller.subject,
      requestId,
      startedAt,
      expiresAt: new Date(startedAt.getTime() + sessionTtlMs),
    });
    if ("heldBy" in opened)
      throw new AppError("conflict", `${opened.heldBy.actor} holds control of agent ${id}'s desktop (since ${opened.heldBy.startedAt.toISOString()})`);
    const session: DesktopSession = opened.session;
    const audit = (action: string, detail: Record<string, unknown>) =>
      deps.audit.record(callerAction(caller, requestId, action, agentId, detail)).catch((err: unknown) => {
        log.error("audit record failed", { requestId, action, agentId, err: err instanceof Error ? err.message : String(err) });
      });

    // The viewer's bytes: the spec first, then each message as it comes (the bridge's stdin). The holder's name goes
    // to the file that tells the agent it is being controlled.
    const spec = encodeSpec({ argv: [vncBridgePath, mode, ...(wantsControl ? [caller.subject] : [])], timeoutMs: 0, stdin: true });
    let exec: SocketExec;
    try {
      exec = await startSocketExec(fleet, agent.spec, { spec, requestId, clientSignal: c.req.raw.signal, reason: "desktop" });
    } catch (err) {
      await sessions
        .close(session.id, new Date())
        .catch((e: unknown) => log.warn("desktop viewer: closing the session failed", { requestId, agentId, err: String(e) }));
      throw err;
    }
    const { res, push, endInput } = exec;
    const wake = res.headers.get("x-wake");
    const ws = acceptor!.accept({ "x-request-id": requestId, ...(wake ? { "x-wake": wake } : {}) });
    exec.attach(ws);
    if (wantsControl) await audit("agent.desktop.control", { phase: "start", since: startedAt.toISOString(), sessionId: session.id });

    // The hold, in the open: the session stays live for every gateway and a keep-awake lease shows in the agent's state.
    const hold = holdForViewer({ sessions, fleet, log }, session, async () => (await proxy.resolve(id)).spec, requestId);

    ws.onMessage((data) => {
      if (typeof data === "string") return ws.close(ttyClose.badMessage, "binary messages only: RFB");
      push(data);
    });
    const output = res.body!.pipeThrough(frameDecoder()).getReader();
    let ended = false;
    const end = (error?: string) => {
      if (ended) return;
      ended = true;
      endInput();
      exec.abort(new AppError("client_gone", "the viewer went away"));
      void output.cancel().catch(() => undefined);
      const until = new Date();
      hold.release(until);
      const ms = until.getTime() - startedAt.getTime();
      const times = { since: startedAt.toISOString(), ms, sessionId: session.id, ...(error ? { error } : {}) };
      if (wantsControl) void audit("agent.desktop.control", { phase: "end", ...times, until: until.toISOString() });
      else void audit("agent.desktop.view", times);
    };
    // The viewer left: the bridge's connection is cut (its process group ends with the exec call).
    ws.onClose(() => end());

    void pump(output, ws).then(
      async () => {
        if (!ws.open) return end();
        // The bridge ended under an open socket: the agent going to sleep (1001), or the VNC server gone.
        const state = await fleet.status(agentId).then(
          (s) => s?.state,
          () => undefined,
        );
        end("the VNC stream ended");
        if (state !== undefined && state !== "running" && state !== "dozing") return ws.close(ttyClose.goingAway, "the agent is hibernating");
        ws.close(ttyClose.error, "the agent's VNC server closed the connection");
      },
      (err: unknown) => {
        const message = err instanceof Error ? err.message : String(err);
        end(message);
        if (ws.open) failSocket(ws, err instanceof AppError ? err : new AppError("bad_gateway", `the viewer's stream broke: ${message}`), requestId);
      },
    );
    return c.body(null, 200) as never;
  });

  return r;
}

/** The bridge's stdout as binary messages (each sent before the next is read); stderr and the exit are not the viewer's. */
async function pump(reader: ReadableStreamDefaultReader<Frame>, ws: TtySocket): Promise<void> {
  for (;;) {
    const next = await reader.read();
    if (next.done) return;
    const frame = next.value;
    if (frame.type !== frameType.stdout || frame.payload.byteLength === 0) continue;
    if (!ws.send(frame.payload)) await ws.drained();
  }
}
