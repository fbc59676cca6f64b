// The AgentVM client: the gateway's URL and token (from the options or AGENTVM_URL / AGENTVM_TOKEN), its agents and its pools.
import { Agent } from "./agent.ts";
import { envVar, Http } from "./http.ts";
import { Pools } from "./pools.ts";
import type { AgentInfo, CreateAgentInput } from "./types.ts";

export interface AgentVMOptions {
  /** The gateway's base URL; default `AGENTVM_URL`, else `http://127.0.0.1:8080` (what `npm start` listens on). */
  baseUrl?: string;
  /** A bearer token; default `AGENTVM_TOKEN`. */
  token?: string;
  /** The fetch to use (default the runtime's). */
  fetch?: typeof fetch;
  /** Headers sent with every call. */
  headers?: Record<string, string>;
}

export const defaultBaseUrl = "http://127.0.0.1:8080";

/** `client.agents`: create, find and list agents. */
export class Agents {
  private readonly http: Http;

  constructor(http: Http) {
    this.http = http;
  }

  /** Creates an agent (it sleeps until its first call or exec); `fromCheckpoint` forks one. */
  async create(input: CreateAgentInput = {}): Promise<Agent> {
    const info = await this.http.json<AgentInfo>("POST", "/v1/agents", { json: input });
    return new Agent(this.http, info.id, info);
  }

  /** An agent by id, as the API describes it now. */
  async get(id: string): Promise<Agent> {
    const agent = new Agent(this.http, id);
    await agent.refresh();
    return agent;
  }

  /** A handle on an agent by id, without a call (what it does will say if it does not exist). */
  connect(id: string): Agent {
    return new Agent(this.http, id);
  }

  /** Every agent (pages followed), oldest first. */
  async *list(filters: { namePrefix?: string; image?: string; state?: AgentInfo["state"] } = {}): AsyncGenerator<Agent> {
    let cursor: string | undefined;
    do {
      const page = await this.http.json<{ agents: AgentInfo[]; nextCursor: string | null }>("GET", "/v1/agents", { query: { ...filters, limit: 200, cursor } });
      for (const a of page.agents) yield new Agent(this.http, a.id, a);
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
  }
}

/** A client of one gateway. */
export class AgentVM {
  readonly baseUrl: string;
  readonly agents: Agents;
  readonly pools: Pools;
  /** The HTTP core, for a route the SDK does not wrap: `client.http.json("GET", "/v1/usage", {query})`. */
  readonly http: Http;

  constructor(opts: AgentVMOptions = {}) {
    const fetchFn = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.http = new Http({
      baseUrl: opts.baseUrl ?? envVar("AGENTVM_URL") ?? defaultBaseUrl,
      token: opts.token ?? envVar("AGENTVM_TOKEN"),
      fetch: fetchFn,
      headers: opts.headers ?? {},
    });
    this.baseUrl = this.http.baseUrl;
    this.agents = new Agents(this.http);
    this.pools = new Pools(this.http);
  }

  /** Creates an agent with a client from `client` (or the environment): `const agent = await AgentVM.create({ image: "demo" })`. */
  static async create(input: CreateAgentInput = {}, client: AgentVMOptions = {}): Promise<Agent> {
    return new AgentVM(client).agents.create(input);
  }

  /** A handle on an agent by id with a client from `client` (or the environment). */
  static connect(id: string, client: AgentVMOptions = {}): Agent {
    return new AgentVM(client).agents.connect(id);
  }
}
