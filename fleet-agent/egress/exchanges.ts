// What the egress proxy tells its host about a VM's outbound exchanges, so the host can doze the VM while every call it has open waits on one (fleet-agent/host/doze.ts).

/**
 * One observer per proxy; `exchangeId` is unique per exchange within a VM (a tunnel, a plain HTTP request, a call
 * through an upstream). The proxy calls, in order: `waiting` (again each time the guest speaks last on a tunnel),
 * `answer` for every chunk of the answer before writing it to the guest, and `ended` once.
 */
export interface ExchangeObserver {
  /**
   * The exchange's request went out and its answer has not started: for plain HTTP and upstream calls, the request
   * body ended; for a `CONNECT` tunnel (TLS: the proxy cannot read it), the guest's bytes were the last to move.
   */
  waiting(vmId: string, exchangeId: string): void;
  /**
   * Bytes of the answer arrived from the far end. Undefined: the VM runs, write them now. A promise: the VM dozes and
   * is being resumed (its clock fixed); write them once it resolves (it never rejects: a VM that could not resume has
   * ended, and the connection with it).
   */
  answer(vmId: string, exchangeId: string): Promise<void> | undefined;
  /** The exchange is over (answered, failed, or either side closed). */
  ended(vmId: string, exchangeId: string): void;
}

/** An observer that keeps nothing (a proxy without a host: tests, a driver built alone). */
export const noExchangeObserver: ExchangeObserver = {
  waiting() {},
  answer: () => undefined,
  ended() {},
};

/**
 * An observer that forwards to one bound later: the driver (and its proxy) is built before the host that observes it
 * (the host needs the driver), so the proxy gets this one and the host is bound once it exists (assemble.ts). Until
 * then, and when nothing is ever bound, it keeps nothing.
 */
export class LateExchangeObserver implements ExchangeObserver {
  private target: ExchangeObserver = noExchangeObserver;

  bind(target: ExchangeObserver): void {
    this.target = target;
  }

  waiting(vmId: string, exchangeId: string): void {
    this.target.waiting(vmId, exchangeId);
  }

  answer(vmId: string, exchangeId: string): Promise<void> | undefined {
    return this.target.answer(vmId, exchangeId);
  }

  ended(vmId: string, exchangeId: string): void {
    this.target.ended(vmId, exchangeId);
  }
}
