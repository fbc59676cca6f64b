// Your own agent end to end: the Node example built from its Containerfile through the API (real buildah), run on
// the qemu driver behind the gateway; memory and files survive hibernate, files survive a lost snapshot, logs follow.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { cpSync, createReadStream, existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MANIFEST_FILE } from "../../fleet-agent/drivers/common/state-dir.ts";
import { buildahBuild, buildahPushArchive, buildahRemoveImage, buildahSetup } from "../../images/build/buildah.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { makeRootfsFixture } from "../helpers/rootfs-fixture.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

const example = join(import.meta.dirname, "..", "..", "examples", "node-agent");
/** Bases and buildah's storage, shared with the image builds (IMAGE_CACHE_DIR's default). */
const cacheDir = join(process.env.HOME ?? tmpdir(), ".cache", "agentvm");
let sys: TestSystem;

beforeAll(async () => {
  // Builds on the host: this file tests what runs the image, not where it is built (image-build-vm.test.ts builds in
  // the builder VM, the default, which under TCG costs a minute more per base).
  sys = await startSystem({ driver: await makeDriver(), env: { AGENT_IDLE_TIMEOUT_MS: "600000", IMAGE_BUILDS: "host" } });
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  if (sys) rmSync(sys.dataDir, { recursive: true, force: true });
}, 120_000);

/** POST /v1/images with a tar of `dir` as the body, streamed. */
async function build(dir: string, name: string) {
  const tar = spawn("tar", ["-c", "-C", dir, "."], { stdio: ["ignore", "pipe", "inherit"] });
  return sys.call(`/v1/images?name=${name}`, { method: "POST", body: Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>, duplex: "half" } as RequestInit);
}

function stateDir(agentId: string): string {
  return join(sys.dataDir, "hosts", sys.host.hostId, "vms", agentId);
}

describe("a Node agent from a Containerfile on QEMU", () => {
  let agentId: string;

  it("builds the example image through the API and lists it", async () => {
    const res = await build(example, "node-agent");
    const body = (await res.json()) as {
      image: { id: string; digest: string; sizeBytes: number; config: { cmd: string[]; entrypoint: string[]; port: number } };
    };
    expect(res.status, JSON.stringify(body)).toBe(201);
    expect(body.image.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect([...body.image.config.entrypoint, ...body.image.config.cmd].join(" ")).toContain("server.js");
    const list = (await (await sys.call("/v1/images")).json()) as { images: { name: string }[] };
    expect(list.images.map((i) => i.name)).toContain("node-agent");
  }, 600_000);

  it("creates an agent from it and calls it: a cold boot answers with the agent's id", async () => {
    const agent = await sys.createAgent({ image: "node-agent", diskMiB: 256, memMiB: 512 });
    agentId = agent.id;
    expect(agent).toMatchObject({ image: "node-agent:latest", diskMiB: 256 });
    const res = await sys.call(`/a/${agentId}/`);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-wake")).toBe("boot");
    expect(((await res.json()) as { agentId: string }).agentId).toBe(agentId);
  }, 180_000);

  it("in-memory state and files on its disk survive hibernate and wake", async () => {
    const c1 = (await (await sys.call(`/a/${agentId}/counter`)).json()) as { counter: number };
    const put = await sys.call(`/a/${agentId}/files/notes.txt`, { method: "PUT", body: "kept across sleep" });
    expect(put.status).toBeLessThan(300);
    const hib = await sys.call(`/v1/agents/${agentId}/hibernate`, { method: "POST" });
    expect(((await hib.json()) as { state: string }).state).toBe("hibernated");
    const c2res = await sys.call(`/a/${agentId}/counter`);
    expect(c2res.headers.get("x-wake")).toBe("restore");
    expect(((await c2res.json()) as { counter: number }).counter).toBe(c1.counter + 1);
    expect(await (await sys.call(`/a/${agentId}/files/notes.txt`)).text()).toBe("kept across sleep");
  }, 120_000);

  it("streams tokens over SSE through the gateway", async () => {
    const res = await sys.call(`/a/${agentId}/tokens?n=5`, { headers: { accept: "text/event-stream" } });
    expect(res.headers.get("content-type")).toContain("text/event-stream");
    const text = await res.text();
    expect(text.match(/^data:/gm)?.length).toBeGreaterThanOrEqual(5);
  }, 60_000);

  it("a lost memory snapshot boots cold with the files intact (x-wake: boot)", async () => {
    await sys.call(`/v1/agents/${agentId}/hibernate`, { method: "POST" });
    rmSync(join(stateDir(agentId), MANIFEST_FILE), { force: true });
    const res = await sys.call(`/a/${agentId}/files/notes.txt`);
    expect(res.headers.get("x-wake")).toBe("boot");
    expect(await res.text()).toBe("kept across sleep");
    // Memory did not survive: the counter starts again.
    expect(((await (await sys.call(`/a/${agentId}/counter`)).json()) as { counter: number }).counter).toBe(1);
  }, 180_000);

  it("writing past diskMiB is ENOSPC for the agent; the VM and the host stay fine", async () => {
    const res = await sys.call(`/a/${agentId}/fill?mib=400`, { method: "POST" });
    expect(await res.text()).toContain("ENOSPC");
    expect((await sys.call(`/a/${agentId}/`)).status).toBe(200);
    const disk = join(stateDir(agentId), "disk.ext4");
    expect(existsSync(disk)).toBe(true);
    expect(statSync(disk).size).toBeLessThanOrEqual(256 * 1024 * 1024);
    await sys.call(`/a/${agentId}/fill?mib=0`, { method: "POST" }); // frees the space again
  }, 180_000);

  it("the agent's log has what it printed, and a follow gets what it prints next", async () => {
    await sys.call(`/a/${agentId}/counter`);
    const res = await sys.call(`/v1/agents/${agentId}/logs`);
    expect(res.status).toBe(200);
    expect(await res.text()).toContain("/counter");
    const abort = new AbortController();
    const follow = await sys.call(`/v1/agents/${agentId}/logs?follow=true&tail=0`, { signal: abort.signal });
    const reader = follow.body!.getReader();
    await sys.call(`/a/${agentId}/files/followed-${process.pid}`); // a 404 the agent logs with this name
    let seen = "";
    const decoder = new TextDecoder();
    while (!seen.includes(`followed-${process.pid}`)) {
      const { value, done } = await reader.read();
      if (done) break;
      seen += decoder.decode(value, { stream: true });
    }
    abort.abort();
    expect(seen).toContain(`GET /files/followed-${process.pid} 404`);
  }, 60_000);

  it("deleting the agent removes its disk; then the image can be deleted", async () => {
    expect((await sys.call(`/v1/agents/${agentId}`, { method: "DELETE" })).status).toBe(200);
    expect(existsSync(join(stateDir(agentId), "disk.ext4"))).toBe(false);
    const { images } = (await (await sys.call("/v1/images")).json()) as { images: { id: string; digest: string }[] };
    const del = await sys.call(`/v1/images/${images[0]!.id}`, { method: "DELETE" });
    expect(del.status).toBe(200);
    expect(existsSync(join(sys.dataDir, "images", "sha256", images[0]!.digest.slice(7)))).toBe(false);
  }, 60_000);
});

/** An OCI archive made with buildah: the busybox fixture (httpd on $PORT) with `cmd` as its command. */
async function fixtureArchive(scratch: string, name: string, cmd: string): Promise<string> {
  const fixture = makeRootfsFixture();
  try {
    const ctx = join(scratch, name);
    cpSync(fixture.dir, join(ctx, "root"), { recursive: true, verbatimSymlinks: true });
    writeFileSync(
      join(ctx, "Containerfile"),
      `FROM scratch\nCOPY root/ /\nUSER 1000:1000\nWORKDIR /www\nEXPOSE 8081\nENTRYPOINT ["/bin/sh", "-c"]\nCMD [${JSON.stringify(cmd)}]\n`,
    );
    const setup = buildahSetup(cacheDir, join(scratch, "buildah-tmp"));
    const tag = `localhost/agentvm-test/${name}-${randomBytes(4).toString("hex")}:1`;
    await buildahBuild(setup, { contextDir: ctx, containerfile: join(ctx, "Containerfile"), tag, iidfile: join(scratch, `${name}.iid`) });
    const archive = join(scratch, `${name}.oci.tar`);
    try {
      await buildahPushArchive(setup, tag, archive, "oci-archive");
    } finally {
      await buildahRemoveImage(setup, tag);
    }
    return archive;
  } finally {
    fixture.remove();
  }
}

describe("an OCI archive made with buildah, imported through the API, on QEMU", () => {
  let scratch: string;
  beforeAll(() => {
    scratch = mkdtempSync(join(tmpdir(), "images-system-"));
  });
  afterAll(() => rmSync(scratch, { recursive: true, force: true }));

  const importArchive = (file: string, name: string) =>
    sys.call(`/v1/images?name=${name}&kind=archive`, {
      method: "POST",
      body: Readable.toWeb(createReadStream(file)) as ReadableStream<Uint8Array>,
      duplex: "half",
    } as RequestInit);

  it("imports it, and an agent from it answers with its own environment", async () => {
    const archive = await fixtureArchive(scratch, "httpd", 'echo "workload-started port=$PORT"; exec httpd -f -vv -p "$PORT" -h /www');
    const res = await importArchive(archive, "busybox-httpd");
    const body = (await res.json()) as { image: { config: { port: number; uid: number } } };
    expect(res.status, JSON.stringify(body)).toBe(201);
    expect(body.image.config).toMatchObject({ port: 8081, uid: 1000 });
    const agent = await sys.createAgent({ image: "busybox-httpd", diskMiB: 64 });
    const env = await sys.call(`/a/${agent.id}/cgi-bin/env`);
    expect(env.status).toBe(200);
    expect(await env.text()).toContain(`agent=${agent.id} port=8081 lease=/run/agentvm/leases uid=1000`);
  }, 180_000);

  it("an entrypoint that exits at once is 503 boot_failed with the reason, and the event log keeps the console's tail", async () => {
    const archive = await fixtureArchive(scratch, "exits", "echo going-away-now; exit 3");
    expect((await importArchive(archive, "exits")).status).toBe(201);
    const agent = await sys.createAgent({ image: "exits", diskMiB: 64 });
    const started = performance.now();
    const res = await sys.call(`/a/${agent.id}/`);
    expect(performance.now() - started).toBeLessThan(60_000); // the boot timeout is 120 s: this failed on the console's word
    expect(res.status).toBe(503);
    const { error } = (await res.json()) as { error: { code: string; message: string } };
    expect(error.code).toBe("boot_failed");
    expect(error.message).toContain("exited with status 3");
    await sys.host.flush();
    const events = (await (await sys.call(`/v1/agents/${agent.id}/events`)).json()) as {
      events: { toState: string; detail: { bootFailed?: boolean; consoleTail?: string } | null }[];
    };
    const failed = events.events.find((e) => e.toState === "failed");
    expect(failed?.detail?.bootFailed).toBe(true);
    expect(failed?.detail?.consoleTail).toContain("going-away-now");
  }, 180_000);

  it("a bad Containerfile is 422 build_failed with the reason and registers nothing", async () => {
    const ctx = join(scratch, "bad-context");
    cpSync(example, ctx, { recursive: true });
    writeFileSync(join(ctx, "Containerfile"), 'FROM agentvm/node:bookworm\nRUN ["/bin/sh", "-c", "echo about-to-fail; exit 7"]\nCMD ["node"]\n');
    const res = await build(ctx, "broken");
    expect(res.status).toBe(422);
    const { error } = (await res.json()) as { error: { code: string; message: string } };
    expect(error.code).toBe("build_failed");
    expect(error.message).toContain("about-to-fail");
    const { images } = (await (await sys.call("/v1/images")).json()) as { images: { name: string }[] };
    expect(images.map((i) => i.name)).not.toContain("broken");
    expect(readdirSync(join(sys.dataDir, "images")).filter((n) => n.startsWith(".tmp-"))).toEqual([]);
  }, 120_000);

  it("a corrupt archive is 400 bad_archive and registers nothing", async () => {
    const bad = join(scratch, "corrupt.tar");
    writeFileSync(bad, randomBytes(4096));
    const res = await importArchive(bad, "corrupt");
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { code: string } }).error.code).toBe("bad_archive");
    const { images } = (await (await sys.call("/v1/images")).json()) as { images: { name: string }[] };
    expect(images.map((i) => i.name)).not.toContain("corrupt");
  }, 60_000);
});

describe("the Python example on QEMU", () => {
  it("builds FROM agentvm/python:bookworm, answers, and keeps its memory across hibernate", async () => {
    const res = await build(join(import.meta.dirname, "..", "..", "examples", "python-agent"), "python-agent");
    expect(res.status, await res.clone().text()).toBe(201);
    const agent = await sys.createAgent({ image: "python-agent", diskMiB: 128, memMiB: 384 });
    const hello = await sys.call(`/a/${agent.id}/`);
    expect(hello.status).toBe(200);
    expect(((await hello.json()) as { agentId: string; python: string }).python).toMatch(/^3\./);
    expect(((await (await sys.call(`/a/${agent.id}/counter`)).json()) as { counter: number }).counter).toBe(1);
    await sys.call(`/v1/agents/${agent.id}/hibernate`, { method: "POST" });
    const woke = await sys.call(`/a/${agent.id}/counter`);
    expect(woke.headers.get("x-wake")).toBe("restore");
    expect(((await woke.json()) as { counter: number }).counter).toBe(2);
  }, 600_000);
});
