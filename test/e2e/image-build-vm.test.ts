// A tenant's Containerfile builds in a microVM of its own by default (IMAGE_BUILDS=auto on a QEMU host): RUN runs on the
// guest's kernel with the guest's network, the tenant's builder agent is an agent like any other, and a failing step is
// a 422 with its output. Real QEMU, real buildah inside the VM, the all-in-one's API over real sockets.
import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { release, tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { imageDir } from "../../contracts/image.ts";
import { BUILDER_AGENT_NAME } from "../../gateway/agents/builder-agent.ts";
import { makeDriver } from "../helpers/qemu.ts";
import { sbin } from "../helpers/sbin.ts";
import { startSystem, type TestSystem } from "../helpers/system.ts";

let sys: TestSystem;
let scratch: string;

beforeAll(async () => {
  sys = await startSystem({ driver: await makeDriver(), env: { AGENT_IDLE_TIMEOUT_MS: "600000" } });
  scratch = mkdtempSync(join(tmpdir(), "agentvm-vm-build-"));
}, 60_000);

afterAll(async () => {
  await sys?.stop();
  if (sys) rmSync(sys.dataDir, { recursive: true, force: true });
  if (scratch) rmSync(scratch, { recursive: true, force: true });
}, 120_000);

/** POST /v1/images with a tar of `dir` as the body, streamed; answers the status and the build's JSON. */
interface BuildAnswer {
  image: { id: string; digest: string };
  build: { id: string };
  error: { code: string; message: string };
}

async function build(dir: string, name: string): Promise<{ status: number; body: BuildAnswer }> {
  const tar = spawn("tar", ["-c", "-C", dir, "."], { stdio: ["ignore", "pipe", "inherit"] });
  const res = await sys.call(`/v1/images?name=${name}`, {
    method: "POST",
    body: Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>,
    duplex: "half",
  } as RequestInit);
  return { status: res.status, body: (await res.json()) as BuildAnswer };
}

function context(name: string, containerfile: string, files: Record<string, string> = {}): string {
  const dir = join(scratch, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "Containerfile"), containerfile);
  for (const [f, text] of Object.entries(files)) writeFileSync(join(dir, f), text);
  return dir;
}

async function exec(agentId: string, cmd: string, timeoutMs = 60_000): Promise<{ exitCode: number | null; stdout: string; stderr: string; timedOut: boolean }> {
  const res = await sys.call(`/v1/agents/${agentId}/exec`, {
    method: "POST",
    body: JSON.stringify({ cmd, timeoutMs }),
    headers: { "content-type": "application/json" },
  });
  expect(res.status, await res.clone().text()).toBe(200);
  return (await res.json()) as { exitCode: number | null; stdout: string; stderr: string; timedOut: boolean };
}

async function builderId(): Promise<string> {
  const { agents } = (await (await sys.call("/v1/agents?limit=100")).json()) as { agents: { id: string; name: string }[] };
  return agents.find((a) => a.name === BUILDER_AGENT_NAME)!.id;
}

/** buildah in the builder, on the script's storage. */
const inBuilder = "buildah --storage-driver vfs --root /var/lib/agentvm-build/storage --runroot /run/agentvm-build";

describe("image builds in the tenant's builder microVM (the default on a QEMU host)", () => {
  it("RUN runs on the VM's kernel, without the host's loopback; the builder is the tenant's agent", async () => {
    const port = new URL(sys.url).port;
    const dir = context(
      "probe",
      [
        "FROM agentvm/debian:bookworm",
        // Measured with IMAGE_BUILDS=host: a RUN step there reports the host's kernel and reaches the gateway on its loopback.
        `RUN uname -r > /kernel && (bash -c 'exec 3<>/dev/tcp/127.0.0.1/${port}' 2>/dev/null && echo reached-the-host || echo isolated) > /net`,
        "COPY hello.txt /",
        'CMD ["true"]',
        "",
      ].join("\n"),
      { "hello.txt": "hello from the context\n" },
    );
    const { status, body } = await build(dir, "probe");
    expect(status, JSON.stringify(body)).toBe(201);

    // The build's log: in the builder, each step told once.
    const log = await (await sys.call(`/v1/images/builds/${body.build.id}/log`)).text();
    expect(log).toContain("tenant's builder");
    expect(log.match(/STEP 2\/4: RUN/g)?.length).toBe(1);

    const { agents } = (await (await sys.call(`/v1/agents?limit=100`)).json()) as { agents: { id: string; name: string; image: string }[] };
    const builder = agents.find((a) => a.name === BUILDER_AGENT_NAME);
    expect(builder, JSON.stringify(agents)).toBeDefined();

    // What the steps wrote, read out of the image's root filesystem on the host (debugfs: no mount, no boot).
    const rootfs = join(imageDir(sys.dataDir, body.image.digest), "rootfs.ext4");
    const [kernel, net, hello] = ["/kernel", "/net", "/hello.txt"].map((f) =>
      execFileSync(sbin("debugfs"), ["-R", `cat ${f}`, rootfs], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim(),
    );
    expect(kernel).not.toBe(release());
    expect(net).toBe("isolated");
    expect(hello).toBe("hello from the context");
    // The builder ran as the tenant's agent: its awake time is a run of its own.
    const runs = (await (await sys.call(`/v1/agents/${builder!.id}/runs`)).json()) as { runs: { wakeReason: string }[] };
    expect(runs.runs.length).toBeGreaterThan(0);
  }, 900_000);

  it("a build killed half-way in the builder leaves nothing behind the next one, and a failing step is 422 with its output", async () => {
    const builder = await builderId();
    // What a gateway dying mid-build leaves: the step's process group killed (the exec's connection went), its
    // working container (a whole copy of the base under vfs) still in the builder's storage.
    const job = "/var/lib/agentvm-build/jobs/killed-half-way";
    const killed = await exec(
      builder,
      `mkdir -p ${job}/context && printf 'FROM agentvm/debian:bookworm\nRUN touch /started && sleep 600\n' > ${job}/context/Containerfile && /usr/lib/agentvm/build/build.sh build ${job} Containerfile 0`,
      15_000,
    );
    expect(killed.timedOut, JSON.stringify(killed)).toBe(true);
    expect((await exec(builder, `${inBuilder} containers --quiet | wc -l`)).stdout.trim()).not.toBe("0");

    // The next build, in the same builder (its base already loaded), fails in its RUN: 422 with the step's output,
    // and neither its working container nor the killed one's is left.
    const { status, body } = await build(
      context("broken", 'FROM agentvm/debian:bookworm\nRUN echo about-to-fail-in-the-vm && exit 7\nCMD ["true"]\n'),
      "broken",
    );
    expect(status).toBe(422);
    expect(body.error.code).toBe("build_failed");
    expect(body.error.message).toContain("about-to-fail-in-the-vm");
    expect((await exec(builder, `${inBuilder} containers --quiet | wc -l`)).stdout.trim()).toBe("0");
    const { agents } = (await (await sys.call("/v1/agents?limit=100")).json()) as { agents: { name: string }[] };
    expect(agents.filter((a) => a.name === BUILDER_AGENT_NAME)).toHaveLength(1);
  }, 600_000);
});
