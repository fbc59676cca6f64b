// bench:failover's caller: calls through both gateways in turn, agents created and woken, deleted, and where the database places them.
import { inArray } from "drizzle-orm";
import { agents } from "../../../schema/core.ts";
import type { Db } from "../../../schema/db.ts";
import { hostIds } from "./cluster.ts";

/** Adds one to `status` in `counts` (statuses as strings: "error" for a call that got no answer). */
export function count(counts: Record<string, number>, status: string): void {
  counts[status] = (counts[status] ?? 0) + 1;
}

/** The boot's duration in a `server-timing` header (`boot;dur=N`). */
export function bootMs(res: Response): number | undefined {
  const m = /(?:^|,\s*)boot;dur=([\d.]+)/.exec(res.headers.get("server-timing") ?? "");
  return m ? Number(m[1]) : undefined;
}

export class BenchClient {
  private readonly gateways: readonly string[];
  private readonly token: string;
  private readonly db: Db;

  constructor(opts: { gateways: readonly string[]; token: string; db: Db }) {
    this.gateways = opts.gateways;
    this.token = opts.token;
    this.db = opts.db;
  }

  /** A call through gateway `via % 2`; a call with no answer within 10 s (or refused) is status "error". */
  async call(via: number, path: string, init: RequestInit = {}, bearer = this.token): Promise<{ status: string; res?: Response }> {
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${bearer}`);
    try {
      const res = await fetch(this.gateways[via % this.gateways.length]! + path, { ...init, headers, signal: AbortSignal.timeout(10_000) });
      return { status: String(res.status), res };
    } catch {
      return { status: "error" };
    }
  }

  async hostsOf(ids: readonly string[]): Promise<Map<string, string | null>> {
    const rows = await this.db
      .select({ id: agents.id, hostId: agents.hostId })
      .from(agents)
      .where(inArray(agents.id, [...ids]));
    return new Map(rows.map((r) => [r.id, r.hostId]));
  }

  /** Creates `n` agents through both gateways, calls each once (its cold boot), and returns them by host. */
  async createAndWake(n: number, boots: number[]): Promise<{ ids: string[]; byHost: Map<string, string[]> }> {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      const { status, res } = await this.call(i, "/v1/agents", {
        method: "POST",
        body: JSON.stringify({ idleTimeoutMs: 120_000 }),
        headers: { "content-type": "application/json" },
      });
      if (status !== "201") throw new Error(`POST /v1/agents: ${status} ${await res?.text()}`);
      ids.push(((await res!.json()) as { id: string }).id);
    }
    // One at a time: each first call's boot is a cold boot of the process driver with nothing else booting.
    for (const [i, id] of ids.entries()) {
      const { status, res } = await this.call(i, `/a/${id}/counter`, { method: "POST" });
      if (status !== "200") throw new Error(`first call of ${id}: ${status} ${await res?.text()}`);
      const boot = res!.headers.get("x-wake") === "boot" ? bootMs(res!) : undefined;
      if (boot !== undefined) boots.push(boot);
      await res!.arrayBuffer();
    }
    const placed = await this.hostsOf(ids);
    const byHost = new Map<string, string[]>(hostIds.map((h) => [h, []]));
    for (const id of ids) byHost.get(placed.get(id)!)?.push(id);
    return { ids, byHost };
  }

  async deleteAll(ids: readonly string[]): Promise<void> {
    for (let i = 0; i < ids.length; i += 6) {
      await Promise.all(
        ids.slice(i, i + 6).map(async (id, j) => {
          const { status, res } = await this.call(i + j, `/v1/agents/${id}`, { method: "DELETE" });
          if (status !== "200") throw new Error(`DELETE /v1/agents/${id}: ${status} ${await res?.text()}`);
          await res!.arrayBuffer();
        }),
      );
    }
  }
}
