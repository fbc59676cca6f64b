// Following WebSocket frames in a relayed byte stream: data vs control bytes, boundaries, and the close frames we inject.
import { describe, expect, it } from "vitest";
import fc from "fast-check";
import * as ws from "ws";
import { closeFrame, FrameTracker } from "../../fleet-agent/relay/websocket-frames.ts";

// ws's own frame writer and reader (exported at runtime, not in @types/ws): an independent implementation to check against.
interface WsInternals {
  Sender: { frame(data: Buffer, o: { fin: boolean; rsv1: boolean; opcode: number; mask: boolean; readOnly: boolean; maskKey: Buffer }): Buffer[] };
  Receiver: new (o: { isServer: boolean }) => import("node:stream").Writable;
}
const { Sender, Receiver } = ws as unknown as WsInternals;

/** One frame as a sender puts it on the wire (`mask` for client → server). */
function frame(opcode: number, payload: Buffer, mask: boolean, fin = true): Buffer {
  const list = Sender.frame(payload, { fin, rsv1: false, opcode, mask, readOnly: false, maskKey: Buffer.from([1, 2, 3, 4]) });
  return Buffer.concat(list);
}

describe("frame tracker", () => {
  it("counts data bytes of text, binary and continuation frames but not of ping, pong or close", () => {
    const t = new FrameTracker();
    const text = frame(1, Buffer.from("hello"), false);
    const ping = frame(9, Buffer.from("p"), false);
    const p1 = t.push(text);
    expect(p1.dataBytes).toBe(text.length);
    expect(t.atBoundary()).toBe(true);
    const p2 = t.push(ping);
    expect(p2.dataBytes).toBe(0);
    expect(p2.controlFrames).toBe(1);
    const close = t.push(closeFrame(1000, "bye", false));
    expect(close.close).toBe(true);
    expect(t.frames).toBe(3);
    expect(t.dataFrames).toBe(1);
  });

  it("knows 16- and 64-bit lengths and masked frames", () => {
    for (const size of [125, 126, 65_535, 65_536, 200_000]) {
      for (const mask of [false, true]) {
        const t = new FrameTracker();
        const f = frame(2, Buffer.alloc(size, 7), mask);
        const p = t.push(f);
        expect(p.dataBytes).toBe(f.length);
        expect(t.atBoundary()).toBe(true);
        expect(t.frames).toBe(1);
      }
    }
  });

  it("is mid-frame while a frame is incomplete, at a boundary once it is whole (property over any split)", () => {
    const frames = fc.array(fc.record({ opcode: fc.constantFrom(0, 1, 2, 9, 10), size: fc.nat(70_000), mask: fc.boolean() }), { minLength: 1, maxLength: 6 });
    fc.assert(
      fc.property(frames, fc.array(fc.nat(300_000), { maxLength: 10 }), (specs, cuts) => {
        const wires = specs.map((s) => frame(s.opcode, Buffer.alloc(s.size, 1), s.mask));
        const ends = new Set<number>();
        let total = 0;
        for (const w of wires) ends.add((total += w.length));
        const all = Buffer.concat(wires);
        const points = [...new Set(cuts.map((c) => c % all.length))].filter((c) => c > 0).sort((a, b) => a - b);
        const t = new FrameTracker();
        let from = 0;
        let data = 0;
        for (const c of [...points, all.length]) {
          data += t.push(all.subarray(from, c)).dataBytes;
          expect(t.atBoundary()).toBe(ends.has(c));
          from = c;
        }
        expect(t.frames).toBe(specs.length);
        const expectedData = specs.reduce((sum, s, k) => sum + (s.opcode < 8 ? wires[k]!.length : 0), 0);
        expect(data).toBe(expectedData);
      }),
      { numRuns: 200 },
    );
  });
});

describe("close frames", () => {
  it("an unmasked close frame (to a client) and a masked one (to an agent) decode to code 1001 and the reason", async () => {
    for (const masked of [false, true]) {
      const got = await new Promise<{ code: number; reason: string }>((resolve, reject) => {
        // ws's Receiver validates a frame like a real endpoint: a server expects masked frames, a client unmasked.
        const r = new Receiver({ isServer: masked });
        r.on("conclude", (code: number, reason: Buffer) => resolve({ code, reason: reason.toString() }));
        r.on("error", reject);
        r.write(closeFrame(1001, "agent hibernating", masked));
      });
      expect(got).toEqual({ code: 1001, reason: "agent hibernating" });
    }
  });
});
