// bench:billing's hosts thread as the main thread sees it: the messages both exchange, and starting the thread.
import { Worker } from "node:worker_threads";
import type { BenchShape } from "./fixture.ts";

export type ClientCommand =
  | { type: "prepare"; start: number; end: number; count: number; seqBase: number }
  | { type: "send"; quarter: number }
  | { type: "report"; withRows: boolean }
  | { type: "exit" };
export type ReportRows = { rows: { agentId: string; start: string; activeMs: number; vcpuMs: number; mibMs: number }[] }[];
export interface ClientReply {
  segments: number;
  expectedMs: number;
  accepted: number;
  sent: number;
  cpuUs: number;
  /** report: all tenants' time, each tenant's, and (when asked) the rows */
  ms?: number;
  perTenant?: number[];
  out?: ReportRows;
  error?: string;
}

/** What the hosts thread is started with (its `workerData`). */
export interface HostsData {
  base: string;
  shape: BenchShape;
}

/** The hosts: a worker thread (hosts.ts) with its own event loop, as hosts are other machines; `ask` sends a command and waits for its reply. */
export function startHosts(data: HostsData): { ask(m: ClientCommand): Promise<ClientReply> } {
  const client = new Worker(new URL("./hosts.ts", import.meta.url), { workerData: data });
  const replies: ((m: ClientReply) => void)[] = [];
  client.on("message", (m: ClientReply) => replies.shift()?.(m));
  client.on("error", (e) => {
    throw e;
  });
  return {
    ask: (m) =>
      new Promise<ClientReply>((resolve) => {
        replies.push(resolve);
        client.postMessage(m);
      }),
  };
}
