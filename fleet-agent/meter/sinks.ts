// Segments shipped to billing over HTTP with a component token (in one process, billing's own sink takes them: billing/sink.ts).
import { signComponentToken } from "../../lib/host-token.ts";
import type { MeterSegment } from "../../contracts/meter.ts";
import type { SegmentSink, ShipResult } from "./shipper.ts";

export interface HttpSinkOptions {
  /** Base URL of billing (the gateway in a split deployment), e.g. http://billing:8080. */
  billingUrl: string;
  hostId: string;
  /** Shared component key (`componentKey(secret)` from lib/host-token.ts). */
  key: Uint8Array;
  /** Per request. Default 30 s. */
  timeoutMs?: number;
  fetch?: typeof fetch;
}

/** `POST {billingUrl}/v1/meter-segments` with `Authorization: Bearer <component token sub=hostId aud=billing>`. */
export class HttpSink implements SegmentSink {
  private readonly o: HttpSinkOptions;
  private token: { value: string; until: number } | undefined;
  private readonly url: string;

  constructor(opts: HttpSinkOptions) {
    this.o = opts;
    this.url = `${opts.billingUrl.replace(/\/+$/, "")}/v1/meter-segments`;
  }

  private async bearer(): Promise<string> {
    // tokens live 60 s; sign a fresh one every 30 s
    if (!this.token || Date.now() >= this.token.until) {
      this.token = { value: await signComponentToken(this.o.key, { sub: this.o.hostId, aud: "billing" }, 60), until: Date.now() + 30_000 };
    }
    return this.token.value;
  }

  async ship(batch: MeterSegment[]): Promise<ShipResult> {
    const doFetch = this.o.fetch ?? fetch;
    const res = await doFetch(this.url, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${await this.bearer()}` },
      body: JSON.stringify({ segments: batch }),
      signal: AbortSignal.timeout(this.o.timeoutMs ?? 30_000),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`billing answered ${res.status}: ${text.slice(0, 300)}`);
    const body = JSON.parse(text) as Partial<ShipResult>;
    if (!Array.isArray(body.accepted) || !Array.isArray(body.duplicates) || !Array.isArray(body.rejected))
      throw new Error("billing answered 200 without accepted/duplicates/rejected lists");
    return { accepted: body.accepted, duplicates: body.duplicates, rejected: body.rejected };
  }
}
