// WebSocket frame boundaries (RFC 6455 §5.2) seen in a byte stream that is passed through untouched.
//
// The relay never buffers or rewrites frames; it only follows their headers, to know whether bytes belong to a
// data frame (work: keeps the agent awake) or a control frame (ping/pong keep a socket open, not a VM awake),
// and whether the stream sits between frames, where a close frame of our own may be put in.

export interface FrameProgress {
  /** Bytes of this chunk that belong to data frames (text, binary, continuation), headers included. */
  dataBytes: number;
  /** Control frames whose header completed in this chunk. */
  controlFrames: number;
  /** A close frame started in this chunk. */
  close: boolean;
}

export class FrameTracker {
  /** Header bytes collected for the frame being read (at most 14). */
  private header = new Uint8Array(14);
  private headerLen = 0;
  private headerNeed = 2;
  private payloadLeft = 0;
  private opcode = 0;
  private inPayload = false;
  /** Frames seen whole, for tests and logs. */
  frames = 0;
  dataFrames = 0;

  /** True between frames: a frame of our own can be written without corrupting the stream. */
  atBoundary(): boolean {
    return !this.inPayload && this.headerLen === 0;
  }

  push(chunk: Uint8Array): FrameProgress {
    const out: FrameProgress = { dataBytes: 0, controlFrames: 0, close: false };
    let i = 0;
    const n = chunk.length;
    while (i < n) {
      if (this.inPayload) {
        const take = Math.min(this.payloadLeft, n - i);
        if (this.opcode < 8) out.dataBytes += take;
        this.payloadLeft -= take;
        i += take;
        if (this.payloadLeft === 0) this.endFrame();
        continue;
      }
      this.header[this.headerLen++] = chunk[i++]!;
      if (this.headerLen === 1) {
        this.opcode = this.header[0]! & 0x0f;
        if (this.opcode < 8) out.dataBytes++;
        continue;
      }
      if (this.opcode < 8) out.dataBytes++;
      if (this.headerLen === 2) {
        const b1 = this.header[1]!;
        const len7 = b1 & 0x7f;
        this.headerNeed = 2 + (len7 === 126 ? 2 : len7 === 127 ? 8 : 0) + (b1 & 0x80 ? 4 : 0);
      }
      if (this.headerLen < this.headerNeed) continue;
      // Header complete.
      const len7 = this.header[1]! & 0x7f;
      let len = len7;
      if (len7 === 126) len = (this.header[2]! << 8) | this.header[3]!;
      else if (len7 === 127) {
        len = 0;
        for (let k = 2; k < 10; k++) len = len * 256 + this.header[k]!;
      }
      if (this.opcode >= 8) {
        out.controlFrames++;
        if (this.opcode === 8) out.close = true;
      }
      this.headerLen = 0;
      this.headerNeed = 2;
      if (len === 0) this.endFrame();
      else {
        this.payloadLeft = len;
        this.inPayload = true;
      }
    }
    return out;
  }

  private endFrame(): void {
    this.inPayload = false;
    this.frames++;
    if (this.opcode < 8) this.dataFrames++;
  }
}

/** A close frame with `code` and `reason` (≤ 123 bytes); `masked` for frames a client sends (to the agent). */
export function closeFrame(code: number, reason: string, masked: boolean, maskKey?: Uint8Array): Buffer {
  const text = Buffer.from(reason, "utf8").subarray(0, 123);
  const payload = Buffer.alloc(2 + text.length);
  payload.writeUInt16BE(code, 0);
  text.copy(payload, 2);
  const head = Buffer.from([0x88, (masked ? 0x80 : 0) | payload.length]);
  if (!masked) return Buffer.concat([head, payload]);
  const key = maskKey ?? crypto.getRandomValues(new Uint8Array(4));
  for (let k = 0; k < payload.length; k++) payload[k]! ^= key[k % 4]!;
  return Buffer.concat([head, Buffer.from(key), payload]);
}
