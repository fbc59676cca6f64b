// A restored guest starved of CPU (its QEMU stopped right after `cont`, longer than the old 10 s wait) still wakes
// by its restore, with its memory, once it answers: a cold boot would lose the memory and, on a host that busy, take longer.
import { afterAll, expect, it } from "vitest";
import type { RunningVm } from "../../fleet-agent/drivers/driver.ts";
import { json, makeDriver, makeSpec } from "../helpers/qemu.ts";

const STARVED_MS = 12_000;
let vm: RunningVm;
let stop: (() => Promise<void>) | undefined;

afterAll(async () => {
  await stop?.();
}, 60_000);

it(`a restored guest that first answers ${STARVED_MS / 1000} s after cont is restored, not booted cold`, async () => {
  let starve = false;
  const driver = await makeDriver({
    afterCont: async (pid) => {
      if (!starve || pid === undefined) return;
      process.kill(pid, "SIGSTOP");
      setTimeout(() => process.kill(pid, "SIGCONT"), STARVED_MS);
    },
  });
  const spec = makeSpec();
  vm = (await driver.boot(spec)).vm;
  stop = () => driver.destroy(spec).catch(() => undefined);
  expect(await json(vm.endpoint, "/counter", { method: "POST" })).toEqual({ count: 1 });
  await driver.hibernate(vm);

  starve = true;
  const started = performance.now();
  const woke = await driver.wake(spec);
  vm = woke.vm;
  expect(performance.now() - started).toBeGreaterThanOrEqual(STARVED_MS); // it really waited for the starved guest
  expect(woke.fallbackReason).toBeUndefined();
  expect(woke.mode).toBe("restore");
  expect(await json(vm.endpoint, "/counter", { method: "POST" })).toEqual({ count: 2 }); // the memory came back
  expect(Math.abs(woke.timings.skewAfterMs)).toBeLessThan(50);
}, 120_000);
