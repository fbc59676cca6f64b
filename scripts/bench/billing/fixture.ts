// bench:billing's fixed world: the month it meters, its tenants' zones, the hosts' component secret, its shape and targets; the tenants and agents seeded.
import { agents, tenants } from "../../../schema/core.ts";
import type { Db } from "../../../schema/db.ts";

export const month = "2026-10";
export const zones = ["UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata"] as const;
export const secret = "bench-component-secret-0123456789abcdef";
export const log = (msg: string) => console.error(`[bench-billing] ${msg}`);

/** Targets of issue 15: our ingest at least half as fast as COPY, the month's report under 100 ms with 1 M segments. */
export const targets = { ingestVsCopy: 0.5, reportMs: 100 } as const;

/** What the hosts are: `agents` agents on `hosts` hosts, shipping batches of `batch` segments with `concurrency` requests in flight. */
export interface BenchShape {
  agents: number;
  hosts: number;
  batch: number;
  concurrency: number;
}

/** One tenant per zone (`ten_<i>`), and the agents spread over them in turn. */
export async function seedTenantsAndAgents(db: Db, agentCount: number): Promise<void> {
  for (let i = 0; i < zones.length; i++) await db.insert(tenants).values({ id: `ten_${i}`, name: `tenant ${i}`, timeZone: zones[i]! });
  for (let a = 0; a < agentCount; a += 500) {
    await db.insert(agents).values(
      Array.from({ length: Math.min(500, agentCount - a) }, (_, k) => ({
        id: `agt_${String(a + k).padStart(6, "0")}`,
        tenantId: `ten_${(a + k) % zones.length}`,
        name: `agent ${a + k}`,
        image: "demo",
      })),
    );
  }
}
