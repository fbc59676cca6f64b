// The Node gateway's WebSocket upgrades for exec on a terminal (`/v1/agents/{id}/exec/tty`) and a desktop's viewer (`…/desktop/vnc`): the upgrade goes through the Hono app like any API call, carrying an acceptor the route uses once the command runs.
//
// Auth, the tenant gate, validation and the request id are the app's (gateway/exec/tty.ts); a refusal comes back as
// the app's Response and is written on the socket as a plain HTTP answer. Sockets still open when the gateway stops
// are closed with 1001.
import type { IncomingMessage } from "node:http";
import type { Duplex } from "node:stream";
import { STATUS_CODES } from "node:http";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import { sendErrorOnSocket } from "../../lib/node-respond.ts";
import { ttyAcceptorKey, ttyClose, type TtyAcceptor } from "../exec/tty.ts";
import { handshakeAnswer, WebSocketConnection } from "./websocket-server.ts";

/** The subprotocol a browser offers its token in, and the one the answer selects. */
export const bearerProtocol = "agentvm.bearer.";
export const ttyProtocol = "agentvm.tty";

/** The routes' paths (their query aside): exec on a terminal, and a desktop's viewer (gateway/desktop/vnc.ts), on the same acceptor. */
const ttyPath = /^\/v1\/agents\/[^/?#]+\/(?:exec\/tty|desktop\/vnc)(?:\?|$)/;
/** The subprotocol a viewer (noVNC) offers for RFB's bytes. */
export const binaryProtocol = "binary";

export function isExecTtyUpgrade(url: string): boolean {
  return ttyPath.test(url);
}

export interface ExecTtyUpgrades {
  upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void;
  /** Closes every open terminal with 1001 (the gateway is stopping). */
  goingAway(): void;
  /** Terminals open now. */
  active(): number;
}

/** What the upgrade is sent through: the gateway's Hono app. */
export interface FetchApp {
  fetch(req: Request, env: Record<string, unknown>): Response | Promise<Response>;
}

export function createExecTtyUpgrades(app: FetchApp, log: Logger): ExecTtyUpgrades {
  const open = new Set<WebSocketConnection>();

  async function upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    socket.on("error", () => socket.destroy());
    const headers = new Headers();
    for (let i = 0; i < req.rawHeaders.length; i += 2) headers.append(req.rawHeaders[i]!, req.rawHeaders[i + 1]!);
    // A browser cannot set Authorization on a WebSocket: it may offer the token as a subprotocol instead
    // (`agentvm.bearer.<token>`, beside `agentvm.tty`, the one the answer selects).
    const offered = (headers.get("sec-websocket-protocol") ?? "").split(",").map((p) => p.trim());
    const bearer = offered.find((p) => p.startsWith(bearerProtocol));
    if (bearer && !headers.has("authorization")) headers.set("authorization", `Bearer ${bearer.slice(bearerProtocol.length)}`);
    const chosen = [ttyProtocol, binaryProtocol].find((p) => offered.includes(p));
    const selected: Record<string, string> = chosen ? { "sec-websocket-protocol": chosen } : {};
    // The client going away before the command runs ends the call to the agent.
    const gone = new AbortController();
    const onGone = () => gone.abort(new AppError("client_gone", "the client closed its connection"));
    socket.once("close", onGone);
    const request = new Request(new URL(req.url ?? "/", `http://${req.headers.host ?? "localhost"}`), {
      method: req.method ?? "GET",
      headers,
      signal: gone.signal,
    });
    let accepted: WebSocketConnection | undefined;
    const acceptor: TtyAcceptor = {
      accept(extra) {
        socket.off("close", onGone);
        if (!socket.destroyed) socket.write(handshakeAnswer(req.headers["sec-websocket-key"] ?? "", { ...extra, ...selected }));
        const ws = new WebSocketConnection(socket, head);
        accepted = ws;
        open.add(ws);
        ws.onClose(() => open.delete(ws));
        return ws;
      },
    };
    const res = await app.fetch(request, { incoming: req, [ttyAcceptorKey]: acceptor });
    if (accepted) return;
    socket.off("close", onGone);
    if (socket.destroyed) return;
    const body = Buffer.from(await res.arrayBuffer());
    let answer = `HTTP/1.1 ${res.status} ${STATUS_CODES[res.status] ?? ""}\r\n`;
    res.headers.forEach((value, name) => {
      if (name !== "content-length" && name !== "connection" && name !== "transfer-encoding") answer += `${name}: ${value}\r\n`;
    });
    socket.end(Buffer.concat([Buffer.from(`${answer}content-length: ${body.length}\r\nconnection: close\r\n\r\n`, "latin1"), body]));
  }

  return {
    upgrade(req, socket, head) {
      upgrade(req, socket, head).catch((err: unknown) => {
        const requestId = newId("request");
        log.error("terminal upgrade failed", { requestId, path: (req.url ?? "").slice(0, 200), err: err instanceof Error ? err.message : String(err) });
        sendErrorOnSocket(socket, err, requestId);
      });
    },
    goingAway() {
      for (const ws of open) ws.close(ttyClose.goingAway, "the gateway is shutting down");
    },
    active: () => open.size,
  };
}
