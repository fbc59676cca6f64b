// One job at a time, taken from the tenants in turn: a tenant's tenth queued build waits behind one build of each other tenant, not behind all of them.
export class TenantTurns {
  /** Queued jobs by tenant, the tenants in the order their turns come (a Map iterates in insertion order). */
  private readonly waiting = new Map<string, (() => Promise<void>)[]>();
  private running = false;

  /** Queues `job` for `tenantId`; it runs once every tenant ahead in the rotation has had its turn. */
  add(tenantId: string, job: () => Promise<void>): void {
    const jobs = this.waiting.get(tenantId);
    if (jobs) jobs.push(job);
    else this.waiting.set(tenantId, [job]);
    this.next();
  }

  /** Jobs queued and not started. */
  get size(): number {
    let n = 0;
    for (const jobs of this.waiting.values()) n += jobs.length;
    return n;
  }

  private next(): void {
    if (this.running) return;
    const first = this.waiting.entries().next();
    if (first.done) return;
    const [tenantId, jobs] = first.value;
    const job = jobs.shift()!;
    this.waiting.delete(tenantId); // to the back of the rotation
    if (jobs.length > 0) this.waiting.set(tenantId, jobs);
    this.running = true;
    void job()
      .catch(() => undefined) // a job reports its own failure; the queue goes on
      .finally(() => {
        this.running = false;
        this.next();
      });
  }
}
