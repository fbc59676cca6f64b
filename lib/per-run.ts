// Connection pools kept per agent and VM run: a woken VM may be a new process, so a new run drops the old run's pool.

import type { PortEndpoint } from "./node-net.ts";

export class PerRunPools<P> {
  private readonly pools = new Map<string, { runId: string; pool: P }>();
  private readonly make: (endpoint: PortEndpoint) => P;
  private readonly dispose: (pool: P) => void;

  constructor(make: (endpoint: PortEndpoint) => P, dispose: (pool: P) => void) {
    this.make = make;
    this.dispose = dispose;
  }

  /** The pool of `agentId`'s current run, made on first use; an older run's pool is disposed of. */
  get(agentId: string, runId: string, endpoint: PortEndpoint): P {
    const current = this.pools.get(agentId);
    if (current && current.runId === runId) return current.pool;
    if (current) this.dispose(current.pool);
    const pool = this.make(endpoint);
    this.pools.set(agentId, { runId, pool });
    return pool;
  }

  /** Forgets `agentId`'s pool (disposed of) — after the agent is removed. */
  drop(agentId: string): void {
    const current = this.pools.get(agentId);
    this.pools.delete(agentId);
    if (current) this.dispose(current.pool);
  }

  /** Pools kept (one per agent at most). */
  get size(): number {
    return this.pools.size;
  }

  /** Calls `fn` on every pool; a pool it answers `false` for is forgotten (it is empty, nothing to dispose of). */
  sweep(fn: (pool: P) => boolean): void {
    for (const [id, p] of this.pools) if (!fn(p.pool)) this.pools.delete(id);
  }

  close(): void {
    for (const p of this.pools.values()) this.dispose(p.pool);
    this.pools.clear();
  }
}
