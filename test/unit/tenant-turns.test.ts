// Builds are taken from the tenants in turn, one at a time: a tenant with many queued builds does not hold the others back.
import { describe, expect, it } from "vitest";
import { TenantTurns } from "../../images/tenant-turns.ts";

function gate(): { promise: Promise<void>; open(): void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

describe("TenantTurns", () => {
  it("runs one job at a time, the tenants in turn", async () => {
    const turns = new TenantTurns();
    const order: string[] = [];
    let running = 0;
    let most = 0;
    const first = gate();
    const job = (name: string, wait?: Promise<void>) => async () => {
      running++;
      most = Math.max(most, running);
      order.push(name);
      await wait;
      await new Promise((r) => setTimeout(r, 1));
      running--;
    };
    turns.add("ten_a", job("a1", first.promise));
    for (const n of ["a2", "a3", "a4"]) turns.add("ten_a", job(n));
    turns.add("ten_b", job("b1"));
    turns.add("ten_b", job("b2"));
    turns.add("ten_c", job("c1"));
    expect(turns.size).toBe(6);
    first.open();
    while (order.length < 7 || running > 0) await new Promise((r) => setTimeout(r, 2));
    expect(order).toEqual(["a1", "a2", "b1", "c1", "a3", "b2", "a4"]);
    expect(most).toBe(1);
  });

  it("goes on after a job that fails", async () => {
    const turns = new TenantTurns();
    const done: string[] = [];
    turns.add("ten_a", async () => {
      throw new Error("boom");
    });
    turns.add("ten_a", async () => {
      done.push("after");
    });
    while (done.length === 0) await new Promise((r) => setTimeout(r, 2));
    expect(done).toEqual(["after"]);
  });
});
