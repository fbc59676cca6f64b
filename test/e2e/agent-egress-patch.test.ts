// Changing an agent's egress (PATCH allowEgress) over real sockets: refused while it is awake, taken while it sleeps,
// and the VM's next start is given the new setting (the driver sees it in the spec it wakes).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { VmSpec, WakeResult } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

/** The process driver, remembering what each wake was told of egress. */
class RecordingDriver extends ProcessDriver {
  readonly egressAtWake: boolean[] = [];
  override wake(spec: VmSpec): Promise<WakeResult> {
    this.egressAtWake.push(spec.allowEgress);
    return super.wake(spec);
  }
}

let sys: TestSystem;
const driver = new RecordingDriver({});

beforeAll(async () => {
  sys = await startSystem({ driver });
});
afterAll(async () => {
  await sys?.stop();
});

const patch = (id: string, body: unknown) =>
  sys.call(`/v1/agents/${id}`, { method: "PATCH", body: JSON.stringify(body), headers: { "content-type": "application/json" } });

describe("PATCH allowEgress", () => {
  it("is refused while the agent is awake, taken while it sleeps, and given to its next wake", async () => {
    const agent = await sys.createAgent({ idleTimeoutMs: 60_000 });
    expect(agent.allowEgress).toBe(false);
    expect((await sys.call(`/a/${agent.id}/counter`, { method: "POST" })).status).toBe(200);
    const awake = await patch(agent.id, { allowEgress: true });
    expect(awake.status).toBe(409);
    expect(((await awake.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: "conflict",
      message: expect.stringContaining("allowEgress changes while it sleeps"),
    });
    expect((await patch(agent.id, { idleTimeoutMs: 30_000 })).status).toBe(200); // the rest may change while it runs

    expect((await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).status).toBe(200);
    const slept = await patch(agent.id, { allowEgress: true });
    expect(slept.status, await slept.clone().text()).toBe(200);
    expect(((await slept.json()) as { allowEgress: boolean }).allowEgress).toBe(true);
    const woke = await sys.call(`/a/${agent.id}/counter`, { method: "POST" });
    expect(woke.headers.get("x-wake")).toBe("restore");
    expect(await woke.json()).toEqual({ count: 2 });
    expect(driver.egressAtWake.at(-1)).toBe(true);
    expect((await patch(agent.id, { allowEgress: "yes" })).status).toBe(400);
  });
});
