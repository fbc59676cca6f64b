// The process driver running a built image, with real processes: a busybox rootfs made here, turned into an ext4
// with mke2fs, unpacked by the driver with debugfs and started through the launcher (chroot, uid 1000) as
// `busybox httpd` serving shell CGI scripts. Boot, what the agent sees, hibernate/wake (the whole process group
// frozen), cold boots over the kept files, leases, the log, boot failures, destroy, what the unpack preserves, and a
// killed fleet-agent taking the agent with it, a daemon it started too (its PID namespace).
import { execFileSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bootInStandInHost } from "../helpers/stand-in-host.ts";
import { guestLeaseDir, type ImageArtifact, type ImageConfig } from "../../contracts/image.ts";
import { AppError } from "../../lib/errors.ts";
import { createLogger } from "../../lib/log.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import type { RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver, type ProcessDriverOptions } from "../../fleet-agent/drivers/process/driver.ts";

const BUSYBOX = "/bin/busybox";
const tools = ["/usr/sbin/mke2fs", "/usr/sbin/debugfs", BUSYBOX];
const isRoot = process.getuid?.() === 0;
const missing = tools.filter((t) => !existsSync(t));
const hasGcc = (() => {
  try {
    execFileSync("gcc", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();
// Root is needed for the chroot (no provisioning gives it); the tools are what `npm test`'s provisioning installs.
const skip = !isRoot
  ? "the process driver runs built images only as root (chroot)"
  : missing.length > 0 || !hasGcc
    ? process.env.CI === "true"
      ? undefined
      : `needs ${[...missing, ...(hasGcc ? [] : ["gcc"])].join(", ")} (busybox-static, e2fsprogs, gcc)`
    : undefined;
if (skip) console.warn(`test/e2e/process-image.test.ts: skipped: ${skip}`);

const UID = 1000;
const CGI: Record<string, string> = {
  env: `echo "agent=$AGENT_ID port=$PORT lease=$LEASE_DIR uid=$(id -u) gid=$(id -g) greeting=$GREETING"`,
  write: `printf '%s' "$QUERY_STRING" > /data/note.txt && echo written`,
  read: `cat /data/note.txt 2>&1`,
  lease: `echo $(( $(date +%s) + 60 )) > "$LEASE_DIR/cgi" && echo leased`,
  shout: `echo "cgi says hello on stderr" >&2; echo shouted`,
  // The answer is out before the kill: the driver ends the whole group (this CGI and its httpd too) as soon as it
  // sees the entrypoint die, and a kill in the foreground raced that against the echo.
  crash: `pid=$(cat /tmp/start.pid); echo crashed; (sleep 0.3; kill -9 "$pid") </dev/null >/dev/null 2>&1 &`,
  // A daemon: its own session, its parent gone (out of the entrypoint's process group and tree).
  daemon: `(setsid sleep 602 </dev/null >/dev/null 2>&1 &); echo started`,
};

let work: string;
let image: ImageArtifact;
const drivers: ProcessDriver[] = [];
const logLines: { msg: string; vmId?: string }[] = [];

/** The rootfs: busybox and its applets, the CGI scripts, a start script, plus what an unpack must keep (modes, links). */
function makeImage(dir: string): ImageArtifact {
  const root = join(dir, "root");
  for (const d of ["bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "etc", "dev", "tmp", "www/cgi-bin", "data", "srv/shared"])
    mkdirSync(join(root, d), { recursive: true });
  writeFileSync(join(root, "bin/busybox"), readFileSync(BUSYBOX), { mode: 0o755 });
  for (const applet of execFileSync(BUSYBOX, ["--list-full"], { encoding: "utf8" }).split("\n").filter(Boolean)) {
    if (applet === "bin/busybox") continue;
    mkdirSync(join(root, dirname(applet)), { recursive: true });
    symlinkSync("/bin/busybox", join(root, applet));
  }
  for (const [name, body] of Object.entries(CGI))
    writeFileSync(join(root, "www/cgi-bin", name), `#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\n${body}\n`, { mode: 0o755 });
  // The server runs as the script's child (no exec): freezing and ending the agent must reach it too.
  writeFileSync(
    join(root, "start.sh"),
    `#!/bin/sh\necho "workload-started port=$PORT agent=$AGENT_ID cwd=$(pwd)"\necho $$ > /tmp/start.pid\nhttpd -f -p "$PORT" -h /www\necho "httpd ended"\n`,
    { mode: 0o755 },
  );
  writeFileSync(join(root, "etc/passwd"), `root:x:0:0:root:/root:/bin/sh\nagent:x:${UID}:${UID}:agent:/data:/bin/sh\n`);
  writeFileSync(join(root, "etc/group"), `root:x:0:\nagent:x:${UID}:\n`);
  chownSync(join(root, "data"), UID, UID);
  chmodSync(join(root, "tmp"), 0o1777);
  writeFileSync(join(root, "usr/local/bin/setuid-tool"), "#!/bin/sh\n", { mode: 0o755 });
  chmodSync(join(root, "usr/local/bin/setuid-tool"), 0o4755);
  chmodSync(join(root, "srv/shared"), 0o2775);
  writeFileSync(join(root, "srv/one-name"), "one file, two names\n");
  linkSync(join(root, "srv/one-name"), join(root, "srv/other-name"));
  symlinkSync("/data", join(root, "srv/agents-link"));
  execFileSync("chown", ["-h", `${UID}:${UID}`, join(root, "srv/agents-link")]);
  execFileSync("mkfifo", ["-m", "0620", join(root, "srv/pipe")]);
  execFileSync("mknod", [join(root, "dev/host-disk"), "b", "8", "0"]); // must not come through
  const rootfs = join(dir, "rootfs.ext4");
  execFileSync("/usr/sbin/mke2fs", ["-q", "-F", "-t", "ext4", "-L", "agentvm-image", "-d", root, rootfs, "32M"]);
  return {
    digest: `sha256:${createHash("sha256").update(readFileSync(rootfs)).digest("hex")}`,
    rootfs,
    sizeBytes: statSync(rootfs).size,
    config: config(),
  };
}

function config(o: Partial<ImageConfig> = {}): ImageConfig {
  return {
    entrypoint: ["/start.sh"],
    cmd: [],
    env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello"],
    workdir: "/www",
    user: "agent",
    uid: UID,
    gid: UID,
    port: 8080,
    ...o,
  };
}

beforeAll(() => {
  if (skip) return;
  work = mkdtempSync(join(tmpdir(), "process-image-"));
  image = makeImage(join(work, "image"));
});
afterAll(async () => {
  await Promise.all(drivers.map((d) => d.close()));
  if (work) rmSync(work, { recursive: true, force: true });
});

function makeDriver(extra: Partial<ProcessDriverOptions> = {}): ProcessDriver {
  const d = new ProcessDriver({
    bootTimeoutMs: 10_000,
    logger: createLogger({ level: "info", write: (l) => logLines.push(JSON.parse(l) as { msg: string; vmId?: string }) }),
    ...extra,
  });
  drivers.push(d);
  return d;
}

function spec(name: string, extra: Partial<VmSpec> = {}): VmSpec {
  return {
    vmId: `vm_${name}`,
    agentId: `agt_${name}`,
    image: image.digest,
    vcpus: 1,
    memMiB: 128,
    allowEgress: false,
    stateDir: join(work, "vms", name),
    rootImage: image,
    diskMiB: 64,
    ...extra,
  };
}

async function cgi(vm: Pick<RunningVm, "endpoint">, script: string, timeoutMs = 5000): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${vm.endpoint.port}/cgi-bin/${script}`, { signal: AbortSignal.timeout(timeoutMs) });
  expect(res.status).toBe(200);
  return (await res.text()).trim();
}

const warnings = (msg: RegExp, vmId: string) => logLines.filter((l) => msg.test(l.msg) && l.vmId === vmId);

/** Polls until `pred` holds, or fails after `ms`. */
async function waitUntil(pred: () => boolean, what: string, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The live processes whose root is `root` (an agent's: its entrypoint and whatever runs under it, wherever it went). */
function inRoot(root: string): { pid: number; cmd: string }[] {
  const found: { pid: number; cmd: string }[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/root`) === root && processAlive(Number(name)))
        found.push({ pid: Number(name), cmd: readFileSync(`/proc/${name}/cmdline`, "utf8").split("\0").join(" ").trim() });
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

describe.skipIf(skip)("process driver: a built image as a host process (NOT isolated)", () => {
  it("boots: the CGI answers with AGENT_ID, PORT and LEASE_DIR, as the image's user, in its workdir", async () => {
    const d = makeDriver();
    const s = spec("boot");
    const { vm } = await d.boot(s);
    expect(vm.endpoint.host).toBe("127.0.0.1");
    expect(await cgi(vm, "env")).toBe(`agent=agt_boot port=${vm.endpoint.port} lease=${guestLeaseDir} uid=${UID} gid=${UID} greeting=hello`);
    expect(readFileSync(d.logPath(s), "utf8")).toContain(`workload-started port=${vm.endpoint.port} agent=agt_boot cwd=/www`);
    // Said loudly, every boot; the size limit it cannot enforce, once per VM.
    expect(warnings(/does NOT isolate/, s.vmId)).toHaveLength(1);
    expect(warnings(/diskMiB is not enforced/, s.vmId)).toHaveLength(1);
    await d.stop(vm);
  });

  it("the unpacked copy keeps owners and modes, and what rdump alone drops: special bits, symlink owners, FIFOs, hard links", () => {
    const root = join(work, "vms", "boot", "rootfs");
    const mode = (p: string) => lstatSync(join(root, p)).mode & 0o7777;
    expect(lstatSync(root).uid).toBe(0);
    expect(mode("")).toBe(0o755);
    expect(lstatSync(join(root, "data")).uid).toBe(UID);
    expect(mode("tmp")).toBe(0o1777);
    expect(mode("usr/local/bin/setuid-tool")).toBe(0o4755);
    expect(mode("srv/shared")).toBe(0o2775);
    expect(mode("www/cgi-bin/env")).toBe(0o755);
    expect(lstatSync(join(root, "srv/agents-link")).uid).toBe(UID);
    expect(lstatSync(join(root, "srv/pipe")).isFIFO()).toBe(true);
    expect(mode("srv/pipe")).toBe(0o620);
    expect(statSync(join(root, "srv/one-name")).ino).toBe(statSync(join(root, "srv/other-name")).ino);
    // The image's device node is not made; the harmless ones are.
    expect(existsSync(join(root, "dev/host-disk"))).toBe(false);
    expect(lstatSync(join(root, "dev/null")).isCharacterDevice()).toBe(true);
    expect(lstatSync(join(root, "dev/null")).rdev).toBe(statSync("/dev/null").rdev);
  });

  it("hibernate freezes the whole agent (its server is the entrypoint's child); wake thaws it with its files", async () => {
    const d = makeDriver();
    const s = spec("cycle");
    const { vm } = await d.boot(s);
    expect(await cgi(vm, "write?kept-across-hibernate")).toBe("written");
    expect(readFileSync(join(s.stateDir, "rootfs/data/note.txt"), "utf8")).toBe("kept-across-hibernate");
    await d.hibernate(vm);
    await expect(cgi(vm, "read", 700)).rejects.toThrow(); // frozen: nothing answers
    const woke = await d.wake(s);
    expect(woke.mode).toBe("restore");
    expect(await cgi(woke.vm, "read")).toBe("kept-across-hibernate");

    // A cold boot (stop, boot) keeps the agent's files: the copy is not unpacked again.
    await d.stop(woke.vm);
    await expect(cgi(woke.vm, "read", 700)).rejects.toThrow(); // the child server went with it
    const again = await d.boot(s);
    expect(again.vm.endpoint.port).not.toBe(0);
    expect(await cgi(again.vm, "read")).toBe("kept-across-hibernate");
    expect(warnings(/does NOT isolate/, s.vmId)).toHaveLength(2);
    expect(warnings(/diskMiB is not enforced/, s.vmId)).toHaveLength(1);
    expect(
      logLines.filter((l) => l.msg === "image unpacked for the process driver" && (l as { dir?: string }).dir === join(s.stateDir, "rootfs")),
    ).toHaveLength(1);

    // A new driver (the fleet-agent restarted) has nothing frozen: wake boots over the same files.
    await d.stop(again.vm);
    const restarted = makeDriver();
    const cold = await restarted.wake(s);
    expect(cold.mode).toBe("boot");
    expect(await cgi(cold.vm, "read")).toBe("kept-across-hibernate");
    await restarted.stop(cold.vm);
  });

  it("leases written in LEASE_DIR count; the log has the workload's output; a new boot starts without leases", async () => {
    const d = makeDriver();
    const s = spec("lease");
    const { vm } = await d.boot(s);
    expect(await d.guestLeases(vm)).toBe(0);
    expect(await cgi(vm, "lease")).toBe("leased");
    expect(await d.guestLeases(vm)).toBe(1);
    expect(await cgi(vm, "shout")).toBe("shouted");
    const log = readFileSync(d.logPath(s), "utf8");
    expect(log).toContain(`workload-started port=${vm.endpoint.port} agent=agt_lease cwd=/www`);
    expect(log).toContain("cgi says hello on stderr");
    await d.stop(vm);
    const again = await d.boot(s);
    expect(await d.guestLeases(again.vm)).toBe(0);
    await d.stop(again.vm);
  });

  it("an entrypoint that exits at once fails the boot at once with the log's tail; one that is missing too", async () => {
    const d = makeDriver({ bootTimeoutMs: 20_000 });
    const failing = { ...image, config: config({ entrypoint: ["/bin/sh", "-c", "echo about to fail; exit 3"] }) };
    const t0 = performance.now();
    const err = await d.boot(spec("exits", { rootImage: failing })).catch((e: unknown) => e);
    expect(performance.now() - t0).toBeLessThan(3000);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toBe("agent agt_exits did not boot: the entrypoint exited (status 3) (log: about to fail)");

    const absent = { ...image, config: config({ entrypoint: ["/no/such/agent"] }) };
    const err2 = await d.boot(spec("absent", { rootImage: absent })).catch((e: unknown) => e);
    expect((err2 as AppError).code).toBe("boot_failed");
    expect((err2 as Error).message).toMatch(
      /the entrypoint exited \(status 127\) \(log: launch: cannot execute \/no\/such\/agent: No such file or directory\)/,
    );
  });

  it("an image that is no ext4 fails the boot, saying what debugfs said; nothing half-unpacked stays", async () => {
    const garbage = join(work, "garbage.ext4");
    writeFileSync(garbage, Buffer.alloc(1 << 20, 0x5a));
    const d = makeDriver();
    const s = spec("garbage", { rootImage: { ...image, rootfs: garbage } });
    const err = await d.boot(s).catch((e: unknown) => e);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(
      /^agent agt_garbage did not boot: debugfs could not unpack .*garbage\.ext4: debugfs: Bad magic number in super-block/,
    );
    expect(readdirSync(s.stateDir).filter((n) => n.includes("rootfs"))).toEqual([]);
  });

  it("an entrypoint that never listens fails at the boot timeout, and is ended", async () => {
    const d = makeDriver({ bootTimeoutMs: 1500 });
    const silent = { ...image, config: config({ entrypoint: ["/bin/sh", "-c", "echo not listening; sleep 60; echo never"] }) };
    const s = spec("silent", { rootImage: silent });
    const t0 = performance.now();
    const err = await d.boot(s).catch((e: unknown) => e);
    const took = performance.now() - t0;
    expect(took).toBeGreaterThan(1400);
    expect(took).toBeLessThan(4000);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(/^agent agt_silent did not boot: nothing listened on 127\.0\.0\.1:\d+ in time \(log: not listening\)$/);
    // The shell's child (sleep) went with it.
    const sleepers = execFileSync("ps", ["-eo", "args"], { encoding: "utf8" })
      .split("\n")
      .filter((l) => l.trim() === "sleep 60");
    expect(sleepers).toEqual([]);
  });

  it("readyPath: ready when it answers below 500", async () => {
    const d = makeDriver();
    const withReady = { ...image, config: config({ readyPath: "/cgi-bin/env" }) };
    const { vm } = await d.boot(spec("ready", { rootImage: withReady }));
    expect(await cgi(vm, "env")).toMatch(/^agent=agt_ready /);
    await d.stop(vm);
  });

  it("without root a built image is refused, saying why", async () => {
    const d = makeDriver({ runningAsRoot: false });
    const err = await d.boot(spec("noroot")).catch((e: unknown) => e);
    expect((err as AppError).code).toBe("boot_failed");
    expect((err as Error).message).toMatch(/runs a built image only as root \(it chroots/);
    expect(existsSync(join(work, "vms", "noroot"))).toBe(false);
  });

  it("several VMs boot at once over a cold launcher cache: one build, no partial files", async () => {
    const cache = join(work, "launcher-cache");
    const d = makeDriver({ launcherCacheDir: cache });
    const vms = await Promise.all(["par1", "par2", "par3"].map((n) => d.boot(spec(n))));
    expect(readdirSync(cache)).toEqual([expect.stringMatching(/^launch-[0-9a-f]{16}$/)]);
    for (const { vm } of vms) expect(await cgi(vm, "env")).toMatch(/^agent=agt_par\d /);
    await Promise.all(vms.map(({ vm }) => d.stop(vm)));
  });

  it("an entrypoint that dies after the boot is a crash told to onExit, and its children go with it", async () => {
    const d = makeDriver();
    const { vm } = await d.boot(spec("crash"));
    const exits: unknown[] = [];
    d.onExit(vm, (e) => exits.push(e));
    expect(await cgi(vm, "crash")).toBe("crashed");
    const deadline = Date.now() + 3000;
    while (exits.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(exits).toEqual([{ code: null, signal: "SIGKILL" }]);
    await new Promise((r) => setTimeout(r, 100));
    await expect(cgi(vm, "env", 700)).rejects.toThrow(); // httpd went with it
  });

  it("reap ends what a previous fleet-agent left running, the entrypoint's children and daemons too", async () => {
    const first = makeDriver();
    const s = spec("leftover");
    const { vm } = await first.boot(s);
    expect(await cgi(vm, "daemon")).toBe("started");
    const root = join(s.stateDir, "rootfs");
    let left: { pid: number; cmd: string }[] = [];
    await waitUntil(() => (left = inRoot(root)).some((p) => p.cmd === "sleep 602"), "the daemon");
    expect(left.map((p) => p.cmd)).toEqual(expect.arrayContaining(["/bin/sh /start.sh", `httpd -f -p ${vm.endpoint.port} -h /www`]));
    // The fleet-agent restarted: it knows nothing of the running agent, and reaps every VM directory with a bare spec.
    await makeDriver().reap({ vmId: s.vmId, agentId: s.agentId, image: "", vcpus: 0, memMiB: 0, allowEgress: false, stateDir: s.stateDir });
    try {
      await waitUntil(() => left.every((p) => !processAlive(p.pid)), "every process of the agent gone", 3000);
    } finally {
      for (const p of inRoot(root)) process.kill(p.pid, "SIGKILL"); // a failure's leftovers
    }
    await expect(cgi(vm, "env", 700)).rejects.toThrow();
  });

  it("kill -9 of the fleet-agent: the entrypoint, its server and a daemon it started are all gone within 3 s", async () => {
    const s = spec("killed");
    // A stand-in fleet-agent: the driver in a process of its own, which boots the agent and is then killed -9.
    const { host: parent, answer } = await bootInStandInHost<{ port: number }>(work, { bootTimeoutMs: 10_000 }, s, "{ port: vm.endpoint.port }");
    const { port } = answer;
    const vm = { spec: s, endpoint: { host: "127.0.0.1", port } };
    expect(await cgi(vm, "daemon")).toBe("started");
    const root = join(s.stateDir, "rootfs");
    let agent: { pid: number; cmd: string }[] = [];
    await waitUntil(() => (agent = inRoot(root)).some((p) => p.cmd === "sleep 602"), "the daemon");
    expect(agent.length).toBeGreaterThanOrEqual(3); // start.sh, httpd, the daemon
    parent.kill("SIGKILL");
    try {
      await waitUntil(() => agent.every((p) => !processAlive(p.pid)), "every process of the agent gone", 3000);
    } finally {
      for (const p of inRoot(root)) process.kill(p.pid, "SIGKILL"); // a failure's leftovers
    }
    await expect(cgi(vm, "env", 700)).rejects.toThrow();
  });

  it("destroy ends the agent and removes its files", async () => {
    const d = makeDriver();
    const s = spec("doomed");
    const { vm } = await d.boot(s);
    expect(existsSync(join(s.stateDir, "rootfs/bin/busybox"))).toBe(true);
    await d.destroy(s);
    expect(processAlive(vm.pid!)).toBe(false);
    expect(existsSync(join(s.stateDir, "rootfs"))).toBe(false);
    expect(existsSync(s.stateDir)).toBe(false);
  });
});
