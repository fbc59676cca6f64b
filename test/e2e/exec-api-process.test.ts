// The exec and files API on the process driver, through the whole system (gateway, host, Postgres, real sockets): the demo agent's exec server runs on the host over an empty root of its own.
//
// The demo's root holds no programs: what this pins is the plumbing on a second driver (files written, read, listed
// and deleted through the gateway; a program that is not there answered 127 with its reason; a hibernation between),
// the same routes the QEMU test drives with a real image (exec-api-qemu.test.ts).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startSystem, type TestSystem } from "../helpers/system.ts";

const isRoot = process.getuid?.() === 0;
let sys: TestSystem;

beforeAll(async () => {
  if (isRoot) sys = await startSystem({ env: { AGENT_IDLE_TIMEOUT_MS: "600000" } });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
}, 60_000);

describe.skipIf(!isRoot)("exec and files on the process driver (root: its exec server chroots)", () => {
  it("files both ways, a listing, a missing program, across a hibernation", async () => {
    const agent = await sys.createAgent({});
    const base = `/v1/agents/${agent.id}/files`;
    const put = await sys.call(`${base}?path=/work/notes.txt&mode=0640&mkdirs=true`, { method: "PUT", body: "hello from the API" });
    expect(put.status, await put.clone().text()).toBe(201);
    expect(await put.json()).toMatchObject({ path: "/work/notes.txt", size: 18, mode: "0640" });
    expect(put.headers.get("x-request-id")).toMatch(/^req_/);
    const listing = (await (await sys.call(`${base}?path=/work`)).json()) as { entries: { name: string; mode: string; size: number }[] };
    expect(listing.entries).toEqual([expect.objectContaining({ name: "notes.txt", mode: "0640", size: 18, type: "file" })]);
    const missing = await sys.call(`/v1/agents/${agent.id}/exec`, { method: "POST", body: JSON.stringify({ cmd: ["python3", "-V"] }) });
    expect(missing.status).toBe(200);
    expect(await missing.json()).toMatchObject({ exitCode: 127, error: expect.stringContaining("python3") });
    expect(((await (await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" })).json()) as { state: string }).state).toBe("hibernated");
    const read = await sys.call(`${base}?path=/work/notes.txt`);
    expect(read.status).toBe(200);
    expect(await read.text()).toBe("hello from the API");
    expect(read.headers.get("x-file-mode")).toBe("0640");
    expect((await sys.call(`${base}?path=/work/notes.txt`, { method: "DELETE" })).status).toBe(204);
    const gone = await sys.call(`${base}?path=/work/notes.txt`);
    expect(gone.status).toBe(404);
    expect(((await gone.json()) as { error: { code: string } }).error.code).toBe("not_found");
    const forbidden = await sys.call(`${base}?path=/proc/self/environ`);
    expect([403, 404]).toContain(forbidden.status);
  }, 120_000);
});
