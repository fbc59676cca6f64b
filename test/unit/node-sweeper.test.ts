// lazySweeper: sweeps run while they find something to look after, stop when one finds nothing, and start again on wake.
import { describe, expect, it } from "vitest";
import { lazySweeper } from "../../lib/node-sweeper.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Waits for `cond` (a loaded machine may run the 5 ms timer late), then lets several periods pass to see nothing more ran. */
async function settlesAt(cond: () => boolean): Promise<void> {
  for (const deadline = Date.now() + 5000; !cond() && Date.now() < deadline; ) await sleep(5);
  expect(cond()).toBe(true);
  await sleep(40);
}

describe("lazySweeper", () => {
  it("sweeps only between a wake and the sweep that finds nothing left", async () => {
    let items = 0;
    let sweeps = 0;
    const sweeper = lazySweeper(5, (now) => {
      expect(now).toBeGreaterThan(0);
      sweeps++;
      if (items > 0) items--;
      return items > 0;
    });
    await sleep(40);
    expect(sweeps).toBe(0); // never woken: never swept
    items = 3;
    sweeper.wake();
    sweeper.wake(); // a second wake while running starts no second timer
    await settlesAt(() => sweeps >= 3);
    expect(sweeps).toBe(3); // two sweeps that left something; the third found nothing and stopped
    items = 1;
    sweeper.wake();
    await settlesAt(() => sweeps >= 4);
    expect(sweeps).toBe(4);
    items = 1000;
    sweeper.wake();
    await settlesAt(() => sweeps >= 6);
    sweeper.stop();
    const stoppedAt = sweeps;
    await sleep(40);
    expect(sweeps).toBe(stoppedAt);
    expect(items).toBeGreaterThan(0); // stopped with something left: stop() ends it anyway
  });
});
