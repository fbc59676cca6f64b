// A clone's fresh identity and the workload's checkpoint requests, through the guest agent of a real QEMU microVM.
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { PassThrough } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { GuestAgentClient, protocolToken } from "../../fleet-agent/drivers/common/guest-agent.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { AppError } from "../../lib/errors.ts";
import { call, makeDriver, makeSpec } from "../helpers/qemu.ts";
import { fixtureConfig, makeRootfsFixture, type RootfsFixture } from "../helpers/rootfs-fixture.ts";

/** A shell line that writes `lines` to `path` (single-quoted: nothing in them is expanded). */
const writeLines = (path: string, lines: string[]) => `printf '%s\\n' ${lines.map((l) => `'${l.replace(/'/g, `'\\''`)}'`).join(" ")} > ${path}`;

/**
 * CGI scripts the entrypoint writes under /data (the agent's own disk, owned by its uid 1000) and serves from there:
 * what a built image's workload sees of /run/agentvm, its hostname and /etc/hostname, a checkpoint request and a
 * lease made as that user.
 */
const CGI_SETUP = [
  "mkdir -p /data/www/cgi-bin",
  "echo ok > /data/www/index.html",
  writeLines("/data/www/cgi-bin/identity", ["#!/bin/sh", "printf 'Content-Type: text/plain\\r\\n\\r\\n'", "cat /run/agentvm/identity 2>&1"]),
  writeLines("/data/www/cgi-bin/names", [
    "#!/bin/sh",
    "printf 'Content-Type: text/plain\\r\\n\\r\\n'",
    'echo "$(hostname) $(cat /etc/hostname) $(grep -c "$(hostname)" /etc/hosts)"',
  ]),
  writeLines("/data/www/cgi-bin/checkpoint", [
    "#!/bin/sh",
    "printf 'Content-Type: text/plain\\r\\n\\r\\n'",
    ': > "/run/agentvm/checkpoint-requests/$QUERY_STRING" && echo requested',
  ]),
  writeLines("/data/www/cgi-bin/lease", [
    "#!/bin/sh",
    "printf 'Content-Type: text/plain\\r\\n\\r\\n'",
    'echo $(( $(date +%s) + 60 )) > "$LEASE_DIR/cgi" && echo leased',
  ]),
  "chmod 755 /data/www/cgi-bin/*",
  'exec httpd -f -p "$PORT" -h /data/www',
].join(" && ");

describe("guest agent client: protocol tokens (host side)", () => {
  it("refuses a value that would split or end the request line, and sends nothing", async () => {
    const wire = new PassThrough();
    let sent = "";
    wire.on("data", (chunk: Buffer) => (sent += chunk.toString()));
    const client = new GuestAgentClient(wire);
    const entropy = new Uint8Array(32);
    for (const bad of [{ agentId: "agt_a b" }, { hostname: "a\nb" }, { clonedFrom: "" }, { clonedFrom: "x\ty" }]) {
      const attempt = client.identity({ agentId: "agt_a", hostname: "a", entropy, clonedFrom: "c", ...bad });
      await expect(attempt).rejects.toBeInstanceOf(AppError);
      await expect(attempt).rejects.toMatchObject({ code: "bad_request" });
    }
    expect(sent).toBe("");
    expect(protocolToken("x", "agt_ok-1")).toBe("agt_ok-1");
    client.close();
  });
});

describe("qemu guest: identity, /random and checkpoint requests", () => {
  let driver: QemuDriver;
  let spec: VmSpec;
  let vm: RunningVm;

  beforeAll(async () => {
    driver = await makeDriver();
    spec = makeSpec();
    vm = (await driver.boot(spec)).vm;
  }, 180_000);

  afterAll(async () => {
    if (vm) await driver?.stop(vm).catch(() => {});
    await driver?.close();
    if (spec) await driver?.destroy(spec);
  });

  it("has no identity until the host pushes one; each push rewrites the file with the next generation", async () => {
    const port = vm.endpoint;
    expect((await call(port, "/identity")).status).toBe(404);
    const agent = driver.guestAgent(vm);

    const first = await agent.identity({ agentId: "agt_clone1", hostname: "clone-1", entropy: randomBytes(32), clonedFrom: "ckp_tpl1" });
    // Root in the guest: the ioctl credits the bytes and the CRNG is reseeded with them at once.
    expect(first).toEqual({ generation: 1, credited: true, reseeded: true });
    const shown = await call(port, "/identity");
    expect(shown.status).toBe(200);
    expect(shown.text).toBe("agentId=agt_clone1\nhostname=clone-1\nclonedFrom=ckp_tpl1\ngeneration=1\n");

    const second = await agent.identity({ agentId: "agt_clone2", hostname: "clone-2.agents", entropy: randomBytes(32), clonedFrom: "ckp_tpl2" });
    expect(second.generation).toBe(2);
    expect((await call(port, "/identity")).text).toBe("agentId=agt_clone2\nhostname=clone-2.agents\nclonedFrom=ckp_tpl2\ngeneration=2\n");
  });

  it("rejects invalid values with the guest's ERR and keeps the identity it had", async () => {
    const agent = driver.guestAgent(vm);
    const good = { agentId: "agt_ok", hostname: "ok", entropy: randomBytes(32), clonedFrom: "ckp_ok" };
    await expect(agent.identity({ ...good, agentId: "vm_notanagent" })).rejects.toThrow(/guest agent: bad agent id/);
    await expect(agent.identity({ ...good, entropy: randomBytes(16) })).rejects.toThrow(/guest agent: bad entropy/);
    await expect(agent.identity({ ...good, hostname: "-starts-with-hyphen" })).rejects.toThrow(/guest agent: bad hostname/);
    await expect(agent.identity({ ...good, hostname: "under_score" })).rejects.toThrow(/guest agent: bad hostname/);
    await expect(agent.identity({ ...good, hostname: "a".repeat(64) })).rejects.toThrow(/guest agent: bad hostname/);
    await expect(agent.identity({ ...good, clonedFrom: "ckp.dot" })).rejects.toThrow(/guest agent: bad clonedFrom/);
    expect((await call(vm.endpoint, "/identity")).text).toContain("generation=2\n");
  });

  it("/random answers 32 hex characters from getrandom(), different every call", async () => {
    const a = await call(vm.endpoint, "/random");
    const b = await call(vm.endpoint, "/random");
    expect(a.status).toBe(200);
    expect(a.text).toMatch(/^[0-9a-f]{32}$/);
    expect(b.text).toMatch(/^[0-9a-f]{32}$/);
    expect(a.text).not.toBe(b.text);
  });

  it("hands each checkpoint request the workload made to the host once", async () => {
    const port = vm.endpoint;
    const agent = driver.guestAgent(vm);
    expect(await agent.checkpointRequests()).toEqual([]);
    expect(await call(port, "/checkpoint?name=a", { method: "POST" })).toMatchObject({ status: 202, text: '{"requested":"a"}' });
    expect((await call(port, "/checkpoint?name=b", { method: "POST" })).status).toBe(202);
    expect((await call(port, "/checkpoint?name=bad%2Fname", { method: "POST" })).status).toBe(400);
    expect((await agent.checkpointRequests()).sort()).toEqual(["a", "b"]);
    expect(await agent.checkpointRequests()).toEqual([]);
    // A request made after a listing waits for the next poll.
    await call(port, "/checkpoint?name=epoch-3.done", { method: "POST" });
    expect(await agent.checkpointRequests()).toEqual(["epoch-3.done"]);
  });
});

describe("qemu: two clones of one checkpoint", () => {
  let driver: QemuDriver;
  let source: VmSpec;
  const clones: VmSpec[] = [];
  let dir: string;

  beforeAll(async () => {
    driver = await makeDriver();
    source = makeSpec();
    const { vm } = await driver.boot(source);
    dir = join(mkdtempSync(join(tmpdir(), "qemu-ckp-")), "ckp_identity1");
    await driver.checkpoint!(source, vm, dir);
    await driver.stop(vm);
  }, 180_000);

  afterAll(async () => {
    await driver?.close();
    for (const spec of [source, ...clones]) if (spec) await driver?.destroy(spec);
    if (dir) rmSync(dirname(dir), { recursive: true, force: true });
  });

  it("each wakes with its own identity, and their getrandom() output differs though their memory was the same", async () => {
    const woken: RunningVm[] = [];
    for (let i = 1; i <= 2; i++) {
      const spec = makeSpec({ agentId: `agt_twin${i}` });
      clones.push(spec);
      await driver.restoreCheckpoint!(spec, dir);
      woken.push((await driver.wake(spec)).vm);
    }
    const [a, b] = woken as [RunningVm, RunningVm];
    expect((await call(a.endpoint, "/identity")).text).toBe("agentId=agt_twin1\nhostname=agt-twin1\nclonedFrom=ckp_identity1\ngeneration=1\n");
    expect((await call(b.endpoint, "/identity")).text).toBe("agentId=agt_twin2\nhostname=agt-twin2\nclonedFrom=ckp_identity1\ngeneration=1\n");
    const ra = (await call(a.endpoint, "/random")).text;
    const rb = (await call(b.endpoint, "/random")).text;
    expect(ra).toMatch(/^[0-9a-f]{32}$/);
    expect(ra).not.toBe(rb);
  });
});

describe("qemu guest with a built image: the workload sees /run/agentvm", () => {
  let fixture: RootfsFixture;
  let driver: QemuDriver;
  let spec: VmSpec;
  let vm: RunningVm;

  beforeAll(async () => {
    fixture = makeRootfsFixture({ config: fixtureConfig({ cmd: [CGI_SETUP] }) });
    driver = await makeDriver();
    spec = makeSpec({ agentId: "agt_identimg", image: fixture.artifact.digest, rootImage: fixture.artifact, diskMiB: 64 });
    vm = (await driver.boot(spec)).vm;
  }, 180_000);

  afterAll(async () => {
    await driver?.close();
    if (spec) await driver?.destroy(spec);
    fixture?.remove();
  });

  it("reads the identity at /run/agentvm/identity, follows the new hostname, and asks for checkpoints as its own user", async () => {
    const port = vm.endpoint;
    const agent = driver.guestAgent(vm);
    expect((await call(port, "/cgi-bin/identity")).text).toMatch(/No such file/);
    expect((await call(port, "/cgi-bin/names")).text.trim()).toBe("agt-identimg agt-identimg 1");

    await agent.identity({ agentId: "agt_identimg", hostname: "fork-7", entropy: randomBytes(32), clonedFrom: "ckp_img" });
    expect((await call(port, "/cgi-bin/identity")).text).toBe("agentId=agt_identimg\nhostname=fork-7\nclonedFrom=ckp_img\ngeneration=1\n");
    expect((await call(port, "/cgi-bin/names")).text.trim()).toBe("fork-7 fork-7 1"); // uname, /etc/hostname, /etc/hosts

    expect((await call(port, "/cgi-bin/checkpoint?episode-1")).text.trim()).toBe("requested");
    expect(await agent.checkpointRequests()).toEqual(["episode-1"]);
    expect(await agent.checkpointRequests()).toEqual([]);
    // The lease directory still sits inside the shared one, as before.
    expect((await call(port, "/cgi-bin/lease")).text.trim()).toBe("leased");
    expect(await driver.guestLeases(vm)).toBe(1);
  });
});
