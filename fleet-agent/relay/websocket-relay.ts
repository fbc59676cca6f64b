// A WebSocket between a client and an agent: the upgrade handshake forwarded, then bytes relayed both ways untouched.
//
// Frames are followed, not parsed into messages (websocket-frames.ts): data frames touch the agent's ticket (an open
// socket keeps the agent awake only while it carries data within the agent's stream idle window; pings do not
// count); before the agent hibernates, or after the proxy idle timeout, both ends get a close frame 1001 with a
// reason, so clients reconnect, and the reconnect wakes the agent again.
import { request, type IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { requestOptions } from "../../lib/node-net.ts";
import type { Duplex } from "node:stream";
import { AppError, logFailure } from "../../lib/errors.ts";
import type { Logger } from "../../lib/log.ts";
import { serverTiming } from "../../contracts/fleet.ts";
import { rollbackHeader, type WakeInfo } from "../../contracts/agent.ts";
import type { Ticket } from "../tickets.ts";
import { downstreamHeaderList } from "../../lib/http-headers.ts";
import { closeFrame, FrameTracker } from "./websocket-frames.ts";
import { sendErrorOnSocket } from "../../lib/node-respond.ts";

export interface RelayInit {
  req: IncomingMessage;
  socket: Duplex;
  /** Bytes the client sent after its upgrade request. */
  head: Buffer;
  requestId: string;
  agentId: string;
  pathInside: string;
  /** The hold on the awake agent; released by `closed`. */
  ticket: Omit<Ticket, "release">;
  headers: string[];
  proxyIdleTimeoutMs: number;
  responseTimeoutMs: number;
  /** The handshake is over (the tenant's concurrent-request slot is given back). */
  handshakeDone: () => void;
  /** Both sockets are closed: the hold can go. Called once. */
  closed: () => void;
}

export interface RelayEnv {
  log: Logger;
  active: Set<WebSocketRelay>;
}

export class WebSocketRelay {
  lastByteAt = performance.now();
  private readonly i: RelayInit;
  private readonly env: RelayEnv;
  private agent: Socket | undefined;
  private readonly toClient = new FrameTracker();
  private readonly toAgent = new FrameTracker();
  private open = false;
  private ended = false;
  private handshakeOver = false;
  private bytes = { toClient: 0, toAgent: 0 };
  private startedAt = performance.now();

  constructor(init: RelayInit, env: RelayEnv) {
    this.i = init;
    this.env = env;
  }

  start(): void {
    const { ticket, req, socket } = this.i;
    this.env.active.add(this);
    socket.on("error", () => this.end("client socket error"));
    socket.on("close", () => this.end("client closed"));
    const up = request({
      ...requestOptions(ticket.endpoint),
      method: req.method ?? "GET",
      path: this.i.pathInside,
      headers: this.i.headers,
      setHost: false,
      agent: false,
    });
    up.on("upgrade", (res, agentSocket, agentHead) => this.opened(res, agentSocket as Socket, agentHead));
    up.on("response", (res) => this.refused(res));
    up.on("error", (err) => {
      if (this.open || this.ended) return;
      this.failHandshake(new AppError("bad_gateway", `agent ${this.i.agentId} failed the WebSocket handshake: ${err.message}`, { cause: err }));
    });
    up.end();
    this.upstreamRequest = up;
  }

  private upstreamRequest: ReturnType<typeof request> | undefined;

  private opened(res: IncomingMessage, agent: Socket, agentHead: Buffer): void {
    const { socket: client, ticket, requestId } = this.i;
    if (this.ended) {
      agent.destroy();
      return;
    }
    this.agent = agent;
    this.open = true;
    this.finishHandshake();
    agent.setNoDelay(true);
    (client as Socket).setNoDelay?.(true);
    const headers = res.rawHeaders;
    let head = `HTTP/1.1 101 ${res.statusMessage || "Switching Protocols"}\r\n`;
    for (let k = 0; k < headers.length; k += 2) head += `${headers[k]}: ${headers[k + 1]}\r\n`;
    head += `x-request-id: ${requestId}\r\nx-wake: ${ticket.wake.wake}\r\n${rollbackLine(ticket.wake)}`;
    const timing = serverTiming(ticket.wake.timings);
    if (timing) head += `server-timing: ${timing}\r\n`;
    client.write(`${head}\r\n`);
    ticket.streaming();
    ticket.firstByte();
    ticket.onHibernate(() => this.goingAway("agent hibernating"));
    agent.on("data", (chunk: Buffer) => this.fromAgent(chunk));
    agent.on("error", () => this.end("agent socket error"));
    agent.on("close", () => this.end("agent closed"));
    agent.on("drain", () => (client as Socket).resume());
    client.on("drain", () => agent.resume());
    client.on("data", (chunk: Buffer) => this.fromClient(chunk));
    if (agentHead.length > 0) this.fromAgent(agentHead);
    if (this.i.head.length > 0) this.fromClient(this.i.head);
    this.env.log.debug("websocket open", { requestId, agentId: this.i.agentId });
  }

  private fromAgent(chunk: Buffer): void {
    const p = this.toClient.push(chunk);
    this.moved(p.dataBytes);
    this.bytes.toClient += chunk.length;
    if (!this.i.socket.write(chunk)) this.agent?.pause();
  }

  private fromClient(chunk: Buffer): void {
    const p = this.toAgent.push(chunk);
    this.moved(p.dataBytes);
    this.bytes.toAgent += chunk.length;
    if (this.agent && !this.agent.write(chunk)) (this.i.socket as Socket).pause();
  }

  private moved(dataBytes: number): void {
    this.lastByteAt = performance.now();
    // Only data frames are work; pings and pongs keep the connection, not the VM.
    if (dataBytes > 0) this.i.ticket.touch();
  }

  /** The agent answered the upgrade with an ordinary response: pass it on, then close. */
  private refused(res: IncomingMessage): void {
    const { socket: client, requestId } = this.i;
    this.finishHandshake();
    const headers = downstreamHeaderList(res.rawHeaders);
    let head = `HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ""}\r\n`;
    for (let k = 0; k < headers.length; k += 2) head += `${headers[k]}: ${headers[k + 1]}\r\n`;
    head += `x-request-id: ${requestId}\r\nx-wake: ${this.i.ticket.wake.wake}\r\n${rollbackLine(this.i.ticket.wake)}connection: close\r\n`;
    client.write(`${head}\r\n`);
    res.on("data", (c: Buffer) => client.write(c));
    res.on("end", () => {
      client.end();
      this.end("upgrade refused");
    });
    res.on("error", () => this.end("agent response failed"));
  }

  private failHandshake(err: AppError): void {
    const { req, requestId, agentId, socket } = this.i;
    logFailure(this.env.log, err, { requestId, method: req.method ?? "GET", path: req.url ?? "", agentId });
    this.finishHandshake();
    sendErrorOnSocket(socket, err, requestId);
    this.end("handshake failed", false);
  }

  private finishHandshake(): void {
    if (this.handshakeOver) return;
    this.handshakeOver = true;
    this.i.handshakeDone();
  }

  /** Close frames 1001 to both ends (where the streams sit between frames), then the sockets close. */
  goingAway(reason: string): void {
    if (this.ended) return;
    this.env.log.info("websocket closed by the gateway", { requestId: this.i.requestId, agentId: this.i.agentId, reason, ...this.bytes });
    const client = this.i.socket;
    if (this.open && this.toClient.atBoundary()) client.write(closeFrame(1001, reason, false));
    if (this.agent && this.toAgent.atBoundary()) this.agent.end(closeFrame(1001, reason, true));
    this.end(reason, true);
  }

  /** Checked by the owner's sweep. */
  sweep(now: number): void {
    if (!this.open) {
      if (!this.ended && now - this.startedAt > this.i.responseTimeoutMs) {
        this.upstreamRequest?.destroy();
        this.failHandshake(
          new AppError("gateway_timeout", `agent ${this.i.agentId} did not answer the WebSocket handshake within ${this.i.responseTimeoutMs} ms`),
        );
      }
      return;
    }
    if (now - this.lastByteAt > this.i.proxyIdleTimeoutMs) this.goingAway("idle timeout");
  }

  /**
   * The one way out: both sockets closed, the ticket released once. `graceful`: what was already written (a close
   * frame, the other end's last frames) is flushed before the socket ends, and a peer that never closes its side
   * is cut after a grace period; otherwise (errors, a failed handshake) the sockets are destroyed.
   */
  private end(why: string, graceful = false): void {
    if (this.ended) return;
    this.ended = true;
    this.env.active.delete(this);
    this.finishHandshake();
    const client = this.i.socket;
    const agent = this.agent;
    if (why === "handshake failed") {
      // sendErrorOnSocket ends the client socket after the error envelope.
    } else if (graceful || why === "agent closed") {
      client.end();
      setTimeout(() => client.destroy(), 2000).unref();
    } else client.destroy();
    if (agent) {
      if (graceful || why === "client closed") {
        agent.end();
        setTimeout(() => agent.destroy(), graceful ? 100 : 2000).unref();
      } else agent.destroy();
    }
    if (!this.open) this.upstreamRequest?.destroy();
    this.i.closed();
    this.env.log.debug("websocket closed", {
      requestId: this.i.requestId,
      agentId: this.i.agentId,
      why,
      ...this.bytes,
      frames: this.toClient.frames + this.toAgent.frames,
    });
  }
}

/** The `x-wake-rollback` header line of a wake that rolled the agent back, else nothing. */
function rollbackLine(wake: WakeInfo): string {
  return wake.timings.rollbackMs ? `${rollbackHeader}: ${wake.timings.rollbackMs}\r\n` : "";
}
