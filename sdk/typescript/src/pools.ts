// Warm pools: forks of one checkpoint kept ready, handed out by acquire and taken back (reset) by release.
import { Agent } from "./agent.ts";
import { AgentVMError } from "./errors.ts";
import { type Http, seg } from "./http.ts";
import type { CreatePoolInput, PoolAcquired, PoolDeleted, PoolInfo, PoolReleased, ResizePoolInput } from "./types.ts";

/** The longest one acquire call waits on the gateway, ms (its `waitMs` bound). */
const maxServerWaitMs = 60_000;

/** A pool: its id and what the API last said of it. */
export class Pool {
  readonly id: string;
  info: PoolInfo;
  private readonly http: Http;

  constructor(http: Http, info: PoolInfo) {
    this.http = http;
    this.id = info.id;
    this.info = info;
  }

  /**
   * An agent of the pool for you alone; the pool tops itself up behind it. At its maxSize with none ready but some
   * being made ready, the API waits for one (`waitMs`, else its default of 10 s; at most 60 s a call); with every agent
   * handed out it answers 409 `pool_exhausted` at once. With `waitMs` the call asks again (every 50–500 ms) until one
   * is ready (a release, or a top-up's fork) or the time is up, then throws that error.
   */
  async acquire(opts: { waitMs?: number; signal?: AbortSignal } = {}): Promise<Agent> {
    const deadline = Date.now() + (opts.waitMs ?? 0);
    for (let pause = 50; ; pause = Math.min(pause * 2, 500)) {
      const query = opts.waitMs === undefined ? "" : `?waitMs=${Math.min(maxServerWaitMs, Math.max(0, Math.round(deadline - Date.now())))}`;
      try {
        const r = await this.http.json<PoolAcquired>("POST", `/v1/pools/${seg(this.id)}/acquire${query}`, { signal: opts.signal });
        return new Agent(this.http, r.agent.id, r.agent, this.id);
      } catch (err) {
        if (!(err instanceof AgentVMError && err.code === "pool_exhausted") || Date.now() + pause > deadline) throw err;
        await new Promise((r) => setTimeout(r, pause));
        opts.signal?.throwIfAborted();
      }
    }
  }

  /**
   * Changes how many ready agents the pool keeps (more: forked now; fewer: the surplus ready ones deleted, never
   * handed-out ones) and how many it may hold in all; answers the pool, as `info` now is.
   */
  async resize(sizes: ResizePoolInput): Promise<PoolInfo> {
    this.info = await this.http.json<PoolInfo>("PATCH", `/v1/pools/${seg(this.id)}`, { json: sizes });
    return this.info;
  }

  /** Gives an agent back: it is reset to the pool's checkpoint and ready for the next acquire. */
  async release(agent: Agent | string): Promise<PoolReleased> {
    const agentId = typeof agent === "string" ? agent : agent.id;
    return this.http.json<PoolReleased>("POST", `/v1/pools/${seg(this.id)}/release`, { json: { agentId } });
  }

  /** The pool now (ready, in use). */
  async refresh(): Promise<PoolInfo> {
    this.info = await this.http.json<PoolInfo>("GET", `/v1/pools/${seg(this.id)}`);
    return this.info;
  }

  /** Deletes the pool and its ready agents (handed-out ones are left to their holders). */
  async delete(): Promise<PoolDeleted> {
    return this.http.json<PoolDeleted>("DELETE", `/v1/pools/${seg(this.id)}`);
  }
}

/** `client.pools`. */
export class Pools {
  private readonly http: Http;

  constructor(http: Http) {
    this.http = http;
  }

  /** A pool of `size` forks of a checkpoint kept ready. */
  async create(input: CreatePoolInput): Promise<Pool> {
    return new Pool(this.http, await this.http.json<PoolInfo>("POST", "/v1/pools", { json: input }));
  }

  async get(id: string): Promise<Pool> {
    return new Pool(this.http, await this.http.json<PoolInfo>("GET", `/v1/pools/${seg(id)}`));
  }

  async list(): Promise<Pool[]> {
    const r = await this.http.json<{ pools: PoolInfo[] }>("GET", "/v1/pools");
    return r.pools.map((p) => new Pool(this.http, p));
  }
}
