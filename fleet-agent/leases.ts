// Keep-awake leases taken through the API on one VM: each holds the VM awake until it expires or is dropped.
import { newId } from "../lib/ids.ts";

export class Leases {
  /** Lease id → monotonic ms at which it expires. */
  private readonly expiries = new Map<string, number>();

  get size(): number {
    return this.expiries.size;
  }

  /** Takes a lease that expires at monotonic `expiresAt`; returns its id. */
  add(expiresAt: number): string {
    const id = newId("lease");
    this.expiries.set(id, expiresAt);
    return id;
  }

  /** False when there was no such lease (already dropped or expired). */
  drop(id: string): boolean {
    return this.expiries.delete(id);
  }

  /**
   * Forgets the leases that expired by `now` and returns the VM's last-activity time counting them: a lease is
   * work until it expires, so the idle timeout runs from its expiry, not from whenever the reaper noticed it.
   */
  expire(now: number, lastActivityAt: number): number {
    let last = lastActivityAt;
    for (const [id, expiresAt] of this.expiries) {
      if (expiresAt > now) continue;
      this.expiries.delete(id);
      last = Math.max(last, expiresAt);
    }
    return last;
  }
}

/** API leases still held at `now` on a VM; expired ones are dropped and count as its activity up to their expiry. */
export function liveLeases(vm: { leases: Leases; lastActivityAt: number }, now: number): number {
  vm.lastActivityAt = vm.leases.expire(now, vm.lastActivityAt);
  return vm.leases.size;
}
