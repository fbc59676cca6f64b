// API keep-awake leases alone: expiry, dropping, and the activity time an expired lease leaves behind.
import { describe, expect, it } from "vitest";
import { Leases, liveLeases } from "../../fleet-agent/leases.ts";

describe("leases", () => {
  it("a lease holds until its expiry; an expired one counts as activity up to its expiry, not up to when it was noticed", () => {
    const vm = { leases: new Leases(), lastActivityAt: 1000 };
    vm.leases.add(5000);
    vm.leases.add(8000);
    expect(liveLeases(vm, 4999)).toBe(2);
    expect(liveLeases(vm, 7000)).toBe(1);
    expect(vm.lastActivityAt).toBe(5000);
    expect(liveLeases(vm, 20_000)).toBe(0);
    expect(vm.lastActivityAt).toBe(8000);
  });

  it("an expired lease never moves the activity time back", () => {
    const vm = { leases: new Leases(), lastActivityAt: 9000 };
    vm.leases.add(5000);
    expect(liveLeases(vm, 10_000)).toBe(0);
    expect(vm.lastActivityAt).toBe(9000);
  });

  it("drop is true once, for a lease that is held", () => {
    const leases = new Leases();
    const id = leases.add(5000);
    expect(leases.drop(id)).toBe(true);
    expect(leases.drop(id)).toBe(false);
    expect(leases.size).toBe(0);
  });
});
