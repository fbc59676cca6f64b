// The per-tenant concurrent-request limit: a counter per tenant, entered before a call is forwarded and left when it ends.
import { AppError } from "../../lib/errors.ts";

export class TenantLimiter {
  private readonly max: number;
  private readonly counts = new Map<string, number>();

  constructor(max: number) {
    this.max = max;
  }

  /** Counts one more call for `tenantId`, or throws 429 (Retry-After 1 s) at the limit. Returns the way out (idempotent). */
  enter(tenantId: string): () => void {
    const n = this.counts.get(tenantId) ?? 0;
    if (n >= this.max) {
      throw new AppError("rate_limited", `tenant has ${n} requests in flight, the limit is ${this.max}`, { retryAfterS: 1 });
    }
    this.counts.set(tenantId, n + 1);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      const now = (this.counts.get(tenantId) ?? 1) - 1;
      if (now <= 0) this.counts.delete(tenantId);
      else this.counts.set(tenantId, now);
    };
  }

  inFlight(tenantId: string): number {
    return this.counts.get(tenantId) ?? 0;
  }
}
