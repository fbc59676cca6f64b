// @agentvm/sdk: the AgentVM client for Node ≥ 20 and other fetch runtimes.
export { Agent, Files, Process } from "./agent.ts";
export { AgentVM, Agents, type AgentVMOptions, defaultBaseUrl } from "./client.ts";
export { AgentVMError } from "./errors.ts";
export { Http, type RequestOptions } from "./http.ts";
export { Pool, Pools } from "./pools.ts";
export type * from "./types.ts";
