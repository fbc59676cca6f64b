// The gateway's WebSocket server codec (gateway/node/websocket-server.ts): the handshake's accept key, frames out, masked client frames in however cut, fragments, refusals.
import { describe, expect, it } from "vitest";
import {
  acceptKey,
  closePayload,
  encodeServerFrame,
  FrameParser,
  maxMessageBytes,
  MessageAssembler,
  opcodes,
  ProtocolError,
} from "../../gateway/node/websocket-server.ts";
import { closeReason, parseControl } from "../../gateway/exec/tty.ts";
import { decodeSpec, encodeSpec, resizeFrame, isOldGuestTtyRefusal } from "../../contracts/exec-wire.ts";
import { AppError } from "../../lib/errors.ts";

/** A client frame: masked with `mask`, the length in 7, 16 or 64 bits as it needs. */
function clientFrame(opcode: number, payload: Uint8Array, fin = true, mask = Buffer.from([1, 2, 3, 4])): Buffer {
  const n = payload.length;
  const head = n < 126 ? Buffer.alloc(2) : n < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  head[0] = (fin ? 0x80 : 0) | opcode;
  if (n < 126) head[1] = 0x80 | n;
  else if (n < 65536) {
    head[1] = 0x80 | 126;
    head.writeUInt16BE(n, 2);
  } else {
    head[1] = 0x80 | 127;
    head.writeBigUInt64BE(BigInt(n), 2);
  }
  const body = Buffer.from(payload);
  for (let i = 0; i < n; i++) body[i]! ^= mask[i & 3]!;
  return Buffer.concat([head, mask, body]);
}

describe("WebSocket server codec", () => {
  it("answers RFC 6455's example key with its accept value", () => {
    expect(acceptKey("dGhlIHNhbXBsZSBub25jZQ==")).toBe("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  });

  it("frames out with 7-, 16- and 64-bit lengths, unmasked and final", () => {
    expect([...encodeServerFrame(opcodes.text, Buffer.from("hi"))]).toEqual([0x81, 2, 0x68, 0x69]);
    const mid = encodeServerFrame(opcodes.binary, new Uint8Array(300));
    expect([mid[0], mid[1], mid.readUInt16BE(2), mid.length]).toEqual([0x82, 126, 300, 304]);
    const big = encodeServerFrame(opcodes.binary, new Uint8Array(70_000));
    expect([big[1], Number(big.readBigUInt64BE(2)), big.length]).toEqual([127, 70_000, 70_010]);
    expect([...closePayload(1000, "")]).toEqual([0x03, 0xe8]);
    expect(closePayload(1011, "x".repeat(200)).length).toBe(125);
  });

  it("reads masked client frames however the bytes are cut", () => {
    const payloads = [Buffer.from("ls\n"), Buffer.alloc(300, 7), Buffer.alloc(70_000, 9)];
    const bytes = Buffer.concat(payloads.map((p) => clientFrame(opcodes.binary, p)));
    for (const cut of [1, 3, 7, 1000, bytes.length]) {
      const parser = new FrameParser();
      const got: Buffer[] = [];
      for (let i = 0; i < bytes.length; i += cut) for (const f of parser.push(bytes.subarray(i, i + cut))) got.push(f.payload);
      expect(got.map((g) => g.length)).toEqual([3, 300, 70_000]);
      expect(got[0]!.toString()).toBe("ls\n");
      expect(got[2]!.every((b) => b === 9)).toBe(true);
    }
  });

  it("joins fragments, passes control frames between them, refuses what RFC 6455 forbids", () => {
    const parser = new FrameParser();
    const assembler = new MessageAssembler();
    const frames = parser.push(
      Buffer.concat([
        clientFrame(opcodes.text, Buffer.from('{"resize":'), false),
        clientFrame(opcodes.ping, Buffer.from("p")),
        clientFrame(opcodes.continuation, Buffer.from("{}}"), true),
      ]),
    );
    const messages = frames.map((f) => assembler.push(f)).filter((m) => m !== undefined);
    expect(messages.map((m) => [m.opcode, m.payload.toString()])).toEqual([
      [opcodes.ping, "p"],
      [opcodes.text, '{"resize":{}}'],
    ]);
    const unmasked = Buffer.from([0x82, 1, 0x41]);
    expect(() => new FrameParser().push(unmasked)).toThrow(ProtocolError);
    expect(() => new FrameParser().push(clientFrame(opcodes.ping, Buffer.alloc(126)))).toThrow(/control frame/);
    expect(() => new MessageAssembler().push({ fin: true, opcode: opcodes.continuation, payload: Buffer.alloc(0) })).toThrow(/continuation/);
    const tooBig = Buffer.alloc(10);
    tooBig[0] = 0x82;
    tooBig[1] = 0x80 | 127;
    tooBig.writeBigUInt64BE(BigInt(maxMessageBytes + 1), 2);
    try {
      new FrameParser().push(tooBig);
      expect.unreachable();
    } catch (err) {
      expect((err as ProtocolError).code).toBe(1009);
    }
  });
});

describe("exec on a terminal: its wire pieces", () => {
  it("the spec carries tty=<rows>x<cols>; a resize is an input frame of type 5", () => {
    const { spec } = decodeSpec(encodeSpec({ argv: ["/bin/sh"], tty: { rows: 24, cols: 80 } }));
    expect(spec).toEqual(["arg=/bin/sh", "tty=24x80"]);
    const frame = resizeFrame({ rows: 40, cols: 132 });
    expect(frame[0]).toBe(5);
    expect(new DataView(frame.buffer).getUint32(1)).toBe(frame.length - 5);
    expect(new TextDecoder().decode(frame.subarray(5))).toBe("rows=40 cols=132");
    expect(isOldGuestTtyRefusal("bad_request", "unknown spec entry: tty=24x80")).toBe(true);
    expect(isOldGuestTtyRefusal("bad_request", "unknown spec entry: other=1")).toBe(false);
  });

  it("control messages: a resize in range, anything else refused; a close reason fits 123 bytes", () => {
    expect(parseControl('{"resize":{"rows":30,"cols":100}}')).toEqual({ rows: 30, cols: 100 });
    for (const bad of ["nope", "{}", '{"resize":{"rows":0,"cols":1}}', '{"resize":{"rows":1.5,"cols":1}}', '{"resize":{"rows":1,"cols":1001}}', "null"])
      expect(parseControl(bad), bad).toBeUndefined();
    const reason = closeReason(new AppError("bad_gateway", "é".repeat(200)));
    expect(Buffer.byteLength(reason)).toBeLessThanOrEqual(123);
    expect(JSON.parse(reason)).toMatchObject({ error: { code: "bad_gateway" } });
    expect(JSON.parse(closeReason(new AppError("bad_gateway", "short")))).toEqual({ error: { code: "bad_gateway", message: "short" } });
  });
});
