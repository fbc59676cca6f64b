// The typed Firecracker API client against the in-test API server (unix socket): Firecracker's documented
// rules are enforced by the server, and every refusal reaches the caller as FirecrackerApiError with the
// server's fault_message.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { FirecrackerApiError, FirecrackerClient, FirecrackerUnreachableError } from "../../fleet-agent/drivers/firecracker/api.ts";
import { FakeFirecracker, type FakeRequestRecord } from "../helpers/firecracker-fake.ts";
import { firecrackerSpecMissing, loadFirecrackerSpec } from "../helpers/firecracker-spec.ts";

const specMissing = firecrackerSpecMissing("test/unit/firecracker-api.test.ts");
const spec = specMissing ? undefined : loadFirecrackerSpec();
// Made before the first test, so that a skipped suite leaves nothing behind.
let root: string;
let kernel: string;
beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "fca-"));
  kernel = join(root, "vmlinux");
  writeFileSync(kernel, "k");
});
let n = 0;
const open: { fake: FakeFirecracker; client: FirecrackerClient }[] = [];

async function start(): Promise<{ fake: FakeFirecracker; client: FirecrackerClient; records: FakeRequestRecord[]; exits: string[]; dir: string }> {
  const dir = join(root, String(n++));
  const records: FakeRequestRecord[] = [];
  const exits: string[] = [];
  mkdirSync(dir);
  const fake = new FakeFirecracker({ apiSock: join(dir, "api.sock"), spec: spec!, record: (r) => records.push(r), exit: (_c, why) => exits.push(why) });
  await fake.listen();
  const client = new FirecrackerClient(join(dir, "api.sock"));
  open.push({ fake, client });
  return { fake, client, records, exits, dir };
}

async function fault(p: Promise<unknown>): Promise<FirecrackerApiError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(FirecrackerApiError);
  return err as FirecrackerApiError;
}

async function configureAndStart(client: FirecrackerClient, dir: string): Promise<void> {
  await client.putMachineConfig({ vcpu_count: 1, mem_size_mib: 128 });
  await client.putBootSource({ kernel_image_path: kernel, boot_args: "console=ttyS0" });
  await client.putVsock({ guest_cid: 3, uds_path: join(dir, "v.sock") });
  await client.action("InstanceStart");
}

afterEach(async () => {
  for (const o of open.splice(0)) {
    await o.client.close();
    await o.fake.close();
  }
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe.skipIf(specMissing)("Firecracker API client", () => {
  it("describes the instance and the configuration it was given", async () => {
    const { client, dir } = await start();
    expect(await client.describeInstance()).toEqual({ app_name: "Firecracker", id: "anonymous-instance", state: "Not started", vmm_version: "1.10.1" });
    expect(await client.version()).toBe("1.10.1");
    await configureAndStart(client, dir);
    expect((await client.describeInstance()).state).toBe("Running");
    const config = await client.vmConfig();
    expect(config["machine-config"]).toEqual({ vcpu_count: 1, mem_size_mib: 128 });
    expect(config.vsock).toEqual({ guest_cid: 3, uds_path: join(dir, "v.sock") });
  });

  it("pre-boot-only calls are refused after InstanceStart, with Firecracker's fault message", async () => {
    const { client, dir } = await start();
    await configureAndStart(client, dir);
    const err = await fault(client.putMachineConfig({ vcpu_count: 2, mem_size_mib: 128 }));
    expect(err.status).toBe(400);
    expect(err.faultMessage).toBe("The requested operation is not supported after starting the microVM.");
    expect(err.message).toBe("firecracker PUT /machine-config → 400: The requested operation is not supported after starting the microVM.");
    expect((await fault(client.putNetworkInterface({ iface_id: "eth0", host_dev_name: "tap0" }))).faultMessage).toMatch(/after starting/);
    expect((await fault(client.action("InstanceStart"))).faultMessage).toMatch(/after starting/);
  });

  it("InstanceStart needs a kernel; a kernel path that does not exist is refused at once", async () => {
    const { client } = await start();
    expect((await fault(client.action("InstanceStart"))).faultMessage).toBe("Cannot start microvm without kernel configuration.");
    expect((await fault(client.putBootSource({ kernel_image_path: join(root, "missing") }))).faultMessage).toMatch(/^The kernel file cannot be opened/);
  });

  it("pause/resume need a started VM; snapshot/create needs a paused one", async () => {
    const { client, dir } = await start();
    expect((await fault(client.pause())).faultMessage).toMatch(/not supported before starting/);
    await configureAndStart(client, dir);
    const snap = { snapshot_type: "Full" as const, snapshot_path: join(dir, "s"), mem_file_path: join(dir, "m") };
    expect((await fault(client.createSnapshot(snap))).faultMessage).toMatch(/not paused/);
    await client.pause();
    expect((await client.describeInstance()).state).toBe("Paused");
    expect((await fault(client.createSnapshot({ ...snap, snapshot_type: "Diff" }))).faultMessage).toMatch(/dirty page tracking disabled/);
    await client.createSnapshot(snap);
    await client.resume();
    expect((await client.describeInstance()).state).toBe("Running");
  });

  it("snapshot/load only on a fresh process; a failed load ends the process", async () => {
    const a = await start();
    await configureAndStart(a.client, a.dir);
    await a.client.pause();
    await a.client.createSnapshot({ snapshot_type: "Full", snapshot_path: join(a.dir, "s"), mem_file_path: join(a.dir, "m") });
    const load = { snapshot_path: join(a.dir, "s"), mem_backend: { backend_type: "File" as const, backend_path: join(a.dir, "m") }, resume_vm: true };

    const configured = await start();
    await configured.client.putMachineConfig({ vcpu_count: 1, mem_size_mib: 128 });
    expect((await fault(configured.client.loadSnapshot(load))).faultMessage).toBe(
      "Loading a microVM snapshot not allowed after configuring boot-specific resources.",
    );
    expect(configured.exits).toEqual([]);

    const broken = await start();
    const err = await fault(broken.client.loadSnapshot({ ...load, mem_backend: { backend_type: "File", backend_path: join(a.dir, "nope") } }));
    expect(err.faultMessage).toMatch(/^Load snapshot error: /);
    await new Promise((r) => setTimeout(r, 60));
    expect(broken.exits).toHaveLength(1);

    const fresh = await start();
    await a.client.close();
    await a.fake.close(); // the vsock socket path is the snapshot's: the old process must be gone
    await fresh.client.loadSnapshot(load);
    expect((await fresh.client.describeInstance()).state).toBe("Running");
  });

  it("a body the schema refuses (unknown field) answers 400 with the reason; unknown paths too", async () => {
    const { client, records } = await start();
    const err = await fault(client.putBootSource({ kernel_image_path: kernel, cmdline: "x" } as never));
    expect(err.faultMessage).toMatch(/unknown property "cmdline"/);
    expect(records.at(-1)!.schemaErrors).toEqual(['body: unknown property "cmdline"']);
    const other = await fault(client.putDrive({ drive_id: "../x", is_root_device: "yes" } as never));
    expect(other.faultMessage).toMatch(/is_root_device: expected boolean/);
  });

  it("a socket nobody listens on is FirecrackerUnreachableError", async () => {
    const client = new FirecrackerClient(join(root, "nobody.sock"), { timeoutMs: 500 });
    await expect(client.describeInstance()).rejects.toBeInstanceOf(FirecrackerUnreachableError);
    await client.close();
  });
});
