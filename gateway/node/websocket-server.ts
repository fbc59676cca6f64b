// The server side of a WebSocket (RFC 6455) on a Node socket, for the gateway's own WebSockets (exec on a terminal): the handshake's answer, frames both ways, close.
//
// Small on purpose: messages of at most `maxMessageBytes`, no extensions (no compression), no subprotocols. Agents'
// own WebSockets are not parsed here: those are relayed byte for byte (fleet-agent/relay/).
import { createHash } from "node:crypto";
import type { Duplex } from "node:stream";

export const opcodes = { continuation: 0, text: 1, binary: 2, close: 8, ping: 9, pong: 10 } as const;

/** The largest message a client may send (a paste into a terminal is far less). */
export const maxMessageBytes = 1024 * 1024;

/** `Sec-WebSocket-Accept` for a client's key. */
export function acceptKey(key: string): string {
  return createHash("sha1").update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest("base64");
}

/** The `101` answer head, with `headers` besides the handshake's own. */
export function handshakeAnswer(key: string, headers: Record<string, string>): string {
  let head = `HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ${acceptKey(key)}\r\n`;
  for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
  return `${head}\r\n`;
}

/** One frame as a server sends it (unmasked, final). */
export function encodeServerFrame(opcode: number, payload: Uint8Array): Buffer {
  const n = payload.byteLength;
  const head = n < 126 ? Buffer.alloc(2) : n < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  head[0] = 0x80 | opcode;
  if (n < 126) head[1] = n;
  else if (n < 65536) {
    head[1] = 126;
    head.writeUInt16BE(n, 2);
  } else {
    head[1] = 127;
    head.writeBigUInt64BE(BigInt(n), 2);
  }
  return Buffer.concat([head, payload]);
}

/** A close frame's payload: the code, then the reason cut to 123 bytes. */
export function closePayload(code: number, reason: string): Buffer {
  const text = Buffer.from(reason, "utf8").subarray(0, 123);
  const out = Buffer.alloc(2 + text.length);
  out.writeUInt16BE(code, 0);
  text.copy(out, 2);
  return out;
}

export interface ClientFrame {
  fin: boolean;
  opcode: number;
  payload: Buffer;
}

/** Why a client's bytes are not a WebSocket we take: the close code to answer with. */
export class ProtocolError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }
}

/** Client frames out of bytes however they are cut; every client frame must be masked (RFC 6455 §5.1). */
export class FrameParser {
  private buffered: Buffer = Buffer.alloc(0);

  /** The frames complete with `chunk`; throws a ProtocolError on a frame we do not take. */
  push(chunk: Buffer): ClientFrame[] {
    this.buffered = this.buffered.length ? Buffer.concat([this.buffered, chunk]) : chunk;
    const out: ClientFrame[] = [];
    for (;;) {
      const b = this.buffered;
      if (b.length < 2) break;
      const fin = (b[0]! & 0x80) !== 0;
      if ((b[0]! & 0x70) !== 0) throw new ProtocolError(1002, "reserved bits set (no extension was agreed)");
      const opcode = b[0]! & 0x0f;
      const masked = (b[1]! & 0x80) !== 0;
      if (!masked) throw new ProtocolError(1002, "a client's frames must be masked");
      let len = b[1]! & 0x7f;
      let at = 2;
      if (len === 126) {
        if (b.length < 4) break;
        len = b.readUInt16BE(2);
        at = 4;
      } else if (len === 127) {
        if (b.length < 10) break;
        const big = b.readBigUInt64BE(2);
        if (big > BigInt(maxMessageBytes)) throw new ProtocolError(1009, `a frame of ${big} bytes is over ${maxMessageBytes}`);
        len = Number(big);
        at = 10;
      }
      if (opcode >= 8 && (len > 125 || !fin)) throw new ProtocolError(1002, "a control frame must be whole and at most 125 bytes");
      if (len > maxMessageBytes) throw new ProtocolError(1009, `a frame of ${len} bytes is over ${maxMessageBytes}`);
      if (b.length < at + 4 + len) break;
      const mask = b.subarray(at, at + 4);
      const payload = Buffer.from(b.subarray(at + 4, at + 4 + len));
      for (let i = 0; i < payload.length; i++) payload[i]! ^= mask[i & 3]!;
      out.push({ fin, opcode, payload });
      this.buffered = b.subarray(at + 4 + len);
    }
    return out;
  }
}

/** Messages out of frames: fragments joined (at most `maxMessageBytes`), control frames handed on between them. */
export class MessageAssembler {
  private parts: Buffer[] = [];
  private bytes = 0;
  private opcode = -1;

  /** A whole message (`text` or `binary`), a control frame, or undefined while a fragmented message is under way. */
  push(frame: ClientFrame): { opcode: number; payload: Buffer } | undefined {
    if (frame.opcode >= 8) return frame;
    if (frame.opcode === opcodes.continuation) {
      if (this.opcode < 0) throw new ProtocolError(1002, "a continuation frame with no message under way");
    } else {
      if (this.opcode >= 0) throw new ProtocolError(1002, "a new message before the last one ended");
      if (frame.opcode !== opcodes.text && frame.opcode !== opcodes.binary) throw new ProtocolError(1002, `unknown opcode ${frame.opcode}`);
      this.opcode = frame.opcode;
    }
    this.bytes += frame.payload.length;
    if (this.bytes > maxMessageBytes) throw new ProtocolError(1009, `a message over ${maxMessageBytes} bytes`);
    this.parts.push(frame.payload);
    if (!frame.fin) return undefined;
    const message = { opcode: this.opcode, payload: this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts) };
    this.parts = [];
    this.bytes = 0;
    this.opcode = -1;
    return message;
  }
}

/** An accepted WebSocket: messages in (text as strings, binary as bytes), messages out, pings answered, one close. */
export class WebSocketConnection {
  private readonly socket: Duplex;
  private readonly parser = new FrameParser();
  private readonly assembler = new MessageAssembler();
  private readonly decoder = new TextDecoder("utf-8", { fatal: true });
  private messageFns: ((data: Uint8Array | string) => void)[] = [];
  private closeFns: (() => void)[] = [];
  private closeSent = false;
  private ended = false;

  /** `head`: bytes the client sent after its handshake. */
  constructor(socket: Duplex, head: Buffer) {
    this.socket = socket;
    (socket as { setNoDelay?(on: boolean): void }).setNoDelay?.(true);
    socket.on("data", (chunk: Buffer) => this.data(chunk));
    socket.on("error", () => socket.destroy());
    socket.on("close", () => this.end());
    if (socket.destroyed) queueMicrotask(() => this.end());
    if (head.length > 0) queueMicrotask(() => this.data(head));
  }

  onMessage(fn: (data: Uint8Array | string) => void): void {
    this.messageFns.push(fn);
  }

  onClose(fn: () => void): void {
    if (this.ended) queueMicrotask(fn);
    else this.closeFns.push(fn);
  }

  send(data: Uint8Array | string): boolean {
    if (this.closeSent || this.socket.destroyed) return true;
    const text = typeof data === "string";
    return this.socket.write(encodeServerFrame(text ? opcodes.text : opcodes.binary, text ? Buffer.from(data, "utf8") : data));
  }

  drained(): Promise<void> {
    if (this.socket.destroyed || !this.socket.writableNeedDrain) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        this.socket.off("drain", done);
        this.socket.off("close", done);
        resolve();
      };
      this.socket.on("drain", done);
      this.socket.on("close", done);
    });
  }

  close(code: number, reason: string): void {
    if (this.closeSent) return;
    this.closeSent = true;
    if (this.socket.destroyed) return;
    this.socket.write(encodeServerFrame(opcodes.close, closePayload(code, reason)));
    this.socket.end();
    // A client that never closes its side is cut.
    setTimeout(() => this.socket.destroy(), 2000).unref();
  }

  pause(): void {
    this.socket.pause();
  }

  resume(): void {
    this.socket.resume();
  }

  get open(): boolean {
    return !this.ended && !this.closeSent;
  }

  private data(chunk: Buffer): void {
    if (this.ended) return;
    try {
      for (const frame of this.parser.push(chunk)) {
        const message = this.assembler.push(frame);
        if (!message) continue;
        if (message.opcode === opcodes.ping) {
          if (!this.closeSent) this.socket.write(encodeServerFrame(opcodes.pong, message.payload));
        } else if (message.opcode === opcodes.close) {
          const code = message.payload.length >= 2 ? message.payload.readUInt16BE(0) : 1000;
          this.close(code === 1005 || code === 1006 ? 1000 : code, "");
          this.end();
          return;
        } else if (message.opcode === opcodes.text) {
          const text = this.decoder.decode(message.payload);
          for (const fn of this.messageFns) fn(text);
        } else if (message.opcode === opcodes.binary) {
          for (const fn of this.messageFns) fn(message.payload);
        }
      }
    } catch (err) {
      if (err instanceof ProtocolError) this.close(err.code, err.message);
      else this.close(1007, "text that is not UTF-8");
      this.end();
    }
  }

  private end(): void {
    if (this.ended) return;
    this.ended = true;
    for (const fn of this.closeFns.splice(0)) fn();
  }
}
