// The exec server on the process driver (the guest's guest-exec built for the host, one per VM) over a built image's
// rootfs with a non-root user: exec as the image's user, files owned by it, escapes resolved inside the root,
// background processes frozen with the VM and ended with it, also with a fleet-agent killed -9 (the server's PID
// namespace), the key. Real processes, real HTTP on loopback.
import { type ChildProcess, execFileSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  existsSync,
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
import type { ImageArtifact } from "../../contracts/image.ts";
import { processAlive } from "../../fleet-agent/drivers/common/proc.ts";
import type { ExecTarget, RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { ProcessDriver } from "../../fleet-agent/drivers/process/driver.ts";
import { encodeSpec, execRequest, execRun, execTty, inputFrame, listTar, makeTar, sh } from "../helpers/exec.ts";

const BUSYBOX = "/bin/busybox";
const isRoot = process.getuid?.() === 0;
const skip = !isRoot
  ? "the process driver's exec server runs only as root (chroot)"
  : !existsSync(BUSYBOX) || !existsSync("/usr/sbin/mke2fs")
    ? "needs busybox-static and e2fsprogs"
    : undefined;
if (skip) console.warn(`test/e2e/exec-process.test.ts: skipped: ${skip}`);
const UID = 1000;

/**
 * The host's pid of a process the exec server names (a pid of its PID namespace, where the driver made one): the
 * process in the agent's root whose innermost pid (the last of its status's NSpid) it is.
 */
function hostPid(pid: number, root: string): number {
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/root`) !== root) continue;
      const nspids = /^NSpid:\s+(.+)$/m
        .exec(readFileSync(`/proc/${name}/status`, "utf8"))?.[1]
        ?.trim()
        .split(/\s+/);
      if (Number(nspids?.at(-1)) === pid) return Number(name);
    } catch {
      // gone meanwhile
    }
  }
  throw new Error(`no process ${pid} in ${root}`);
}

function makeImage(dir: string): ImageArtifact {
  const root = join(dir, "root");
  for (const d of ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "dev", "tmp", "home/agent", "www"]) mkdirSync(join(root, d), { recursive: true });
  writeFileSync(join(root, "bin/busybox"), readFileSync(BUSYBOX), { mode: 0o755 });
  for (const applet of execFileSync(BUSYBOX, ["--list-full"], { encoding: "utf8" }).split("\n").filter(Boolean)) {
    if (applet === "bin/busybox") continue;
    mkdirSync(join(root, dirname(applet)), { recursive: true });
    symlinkSync("/bin/busybox", join(root, applet));
  }
  writeFileSync(join(root, "etc/passwd"), `root:x:0:0:root:/root:/bin/sh\nagent:x:${UID}:${UID}:agent:/home/agent:/bin/sh\n`);
  writeFileSync(join(root, "etc/group"), `root:x:0:\nagent:x:${UID}:\nextra:x:2000:agent\n`);
  chownSync(join(root, "home/agent"), UID, UID);
  chmodSync(join(root, "tmp"), 0o1777);
  const rootfs = join(dir, "rootfs.ext4");
  execFileSync("/usr/sbin/mke2fs", ["-q", "-F", "-t", "ext4", "-L", "agentvm-image", "-d", root, rootfs, "32M"]);
  return {
    digest: `sha256:${createHash("sha256").update(readFileSync(rootfs)).digest("hex")}`,
    rootfs,
    sizeBytes: statSync(rootfs).size,
    config: {
      entrypoint: ["httpd", "-f", "-h", "/www"],
      cmd: [],
      env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello"],
      workdir: "/home/agent",
      user: "agent",
      uid: UID,
      gid: UID,
      port: 8080,
    },
  };
}

describe.skipIf(skip)("guest-exec on the process driver, a built image with a non-root user", () => {
  let work: string;
  let driver: ProcessDriver;
  let spec: VmSpec;
  let vm: RunningVm;
  let t: ExecTarget;

  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), "exec-process-"));
    const image = makeImage(join(work, "image"));
    // httpd takes its port from the command line: the entrypoint is a shell line given PORT.
    image.config.entrypoint = ["/bin/sh", "-c", 'exec httpd -f -p "$PORT" -h /www'];
    driver = new ProcessDriver({ bootTimeoutMs: 10_000 });
    spec = {
      vmId: "vm_exec",
      agentId: "agt_exec",
      image: image.digest,
      vcpus: 1,
      memMiB: 128,
      allowEgress: false,
      stateDir: join(work, "vms", "exec"),
      rootImage: image,
      diskMiB: 64,
    };
    vm = (await driver.boot(spec)).vm;
    t = await driver.execTarget(vm);
  }, 120_000);

  afterAll(async () => {
    await driver?.close();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it("answers with the key only; runs as the image's user in its workdir with its env and groups", async () => {
    expect((await execRequest(t, "GET", "/v1/version")).body.toString()).toBe("agentvm-exec/2");
    expect((await execRequest(t, "GET", "/v1/version", undefined, { key: "f".repeat(64) })).status).toBe(401);
    expect(await driver.execTarget(vm)).toEqual(t);
    expect(await sh(t, 'echo "$(id -u):$(id -g):$(id -G) $(pwd) $GREETING $AGENT_ID"')).toBe(`${UID}:${UID}:${UID} 2000 /home/agent hello agt_exec\n`);
    expect(await sh(t, "id -u", { user: "root" })).toBe("0\n");
    expect(await sh(t, "id -u; id -g", { user: "1234:55" })).toBe("1234\n55\n");
    const r = await execRun(t, { cmd: ["cat"], stdin: "in" });
    expect(r.stdout.toString()).toBe("in");
    expect((await execRun(t, { cmd: ["sleep", "10"], timeoutMs: 200 })).timedOut).toBe(true);
    expect((await execRequest(t, "POST", "/v1/exec", encodeSpec({ cmd: ["id"], user: "nobody-here" }))).status).toBe(400);
  });

  it("a terminal in a root without /dev/pts: one of the server's own (its size, input, the command's status; no name inside)", async () => {
    const r = await execTty(t, { cmd: ["/bin/sh", "-c", "stty size; tty; read x; echo got $x; exit 4"], tty: { rows: 5, cols: 7 } }, [inputFrame(1, "hi\n")]);
    const screen = r.stdout.toString();
    expect(screen).toContain("5 7\r\n");
    expect(screen).toContain("not a tty");
    expect(screen).toContain("got hi\r\n");
    expect(r.stderr.length).toBe(0);
    expect(r.code).toBe(4);
  });

  it("files default to the image's user; a symlink to /etc resolves inside the root; escapes are refused", async () => {
    const put = await execRequest(t, "PUT", "/v1/files?path=/home/agent/notes/a.txt&mkdirs=1", "hi");
    expect(JSON.parse(put.body.toString())).toEqual({ size: 2, mode: 0o644, uid: UID, gid: UID });
    const root = join(spec.stateDir, "rootfs");
    expect(statSync(join(root, "home/agent/notes/a.txt")).uid).toBe(UID);
    expect(statSync(join(root, "home/agent/notes")).uid).toBe(UID);
    await sh(t, "ln -s /etc /tmp/esc");
    const passwd = await execRequest(t, "GET", "/v1/files?path=/tmp/esc/passwd");
    expect(passwd.body.toString()).toContain(`agent:x:${UID}`); // the image's, not the host's
    const list = JSON.parse((await execRequest(t, "GET", "/v1/files?path=/tmp")).body.toString());
    expect(list.entries).toContainEqual(expect.objectContaining({ name: "esc", type: "symlink", uid: UID }));
    expect((await execRequest(t, "GET", "/v1/files?path=/tmp/../../etc/passwd")).status).toBe(400);
    expect((await execRequest(t, "PUT", "/v1/files?path=/run/agentvm/leases/x", "x")).status).toBe(403);
    expect((await execRequest(t, "PUT", "/v1/files?path=/dev/null", "x")).status).toBe(403);
    expect((await execRequest(t, "GET", "/v1/files?path=/dev/null")).status).toBe(403);
    // The user cannot write where the user may not: the exec runs as it, with its rights.
    const denied = await execRun(t, { cmd: ["/bin/sh", "-c", "echo x > /etc/x"] });
    expect(denied.code).not.toBe(0);
    expect(existsSync(join(root, "etc/x"))).toBe(false);
  });

  it("tar out and in inside the root", async () => {
    const out = await execRequest(t, "GET", "/v1/tar?path=/home/agent/notes");
    expect(listTar(out.body).map((e) => `${e.name}:${e.uid}`)).toEqual(["notes/:1000", "notes/a.txt:1000"]);
    const put = await execRequest(t, "PUT", "/v1/tar?path=/home/agent/in", makeTar([{ name: "x", data: "tar", uid: UID, gid: UID, mode: 0o600 }]));
    expect(put.status).toBe(201);
    expect(await sh(t, "cat /home/agent/in/x; stat -c ' %a %u' /home/agent/in/x")).toBe(`tar 600 ${UID}\n`);
  });

  it("a background process's output is kept up to 16 MiB a stream, the rest counted; its timeout kills its group", async () => {
    const big = await execRequest(t, "POST", "/v1/exec", encodeSpec({ cmd: ["/bin/sh", "-c", "head -c 20971520 /dev/zero; echo done >&2"], background: true }));
    const { pid } = JSON.parse(big.body.toString()) as { pid: number };
    const done = JSON.parse((await execRequest(t, "GET", `/v1/procs/${pid}/wait?timeout_ms=20000`)).body.toString());
    expect(done).toMatchObject({ state: "exited", exitCode: 0 });
    const tail = await execRequest(t, "GET", `/v1/procs/${pid}/output?stream=stdout&offset=${16 * 1024 * 1024 - 10}`);
    expect([tail.body.length, tail.headers["x-dropped"], tail.headers["x-eof"], tail.headers["x-next-offset"]]).toEqual([
      10,
      String(4 << 20),
      "1",
      String(16 << 20),
    ]);
    expect((await execRequest(t, "GET", `/v1/procs/${pid}/output?stream=stderr`)).body.toString()).toBe("done\n");
    const slow = await execRequest(t, "POST", "/v1/exec", encodeSpec({ cmd: ["/bin/sh", "-c", "sleep 100 & sleep 100"], background: true, timeoutMs: 300 }));
    const s = JSON.parse(slow.body.toString()) as { pid: number };
    const ended = JSON.parse((await execRequest(t, "GET", `/v1/procs/${s.pid}/wait?timeout_ms=5000`)).body.toString());
    expect(ended).toMatchObject({ state: "exited", signal: 9, timedOut: true });
    // No `sleep 100` left running in this agent's root (read from the host's /proc: the rootfs has none).
    const rootfs = join(spec.stateDir, "rootfs");
    const inRoot = readdirSync("/proc").filter((p) => {
      try {
        return /^\d+$/.test(p) && readlinkSync(`/proc/${p}/root`) === rootfs && readFileSync(`/proc/${p}/cmdline`, "utf8") === "sleep\u0000100\u0000";
      } catch {
        return false;
      }
    });
    expect(inRoot).toEqual([]);
  });

  it("a background process is frozen with the VM, runs again after the wake, and ends with the VM", async () => {
    const started = await execRequest(
      t,
      "POST",
      "/v1/exec",
      encodeSpec({ cmd: ["/bin/sh", "-c", "while true; do date +%s%N >> /tmp/ticks; sleep 0.05; done"], background: true }),
    );
    const { pid } = JSON.parse(started.body.toString()) as { pid: number };
    const host = hostPid(pid, join(spec.stateDir, "rootfs"));
    const ticks = join(spec.stateDir, "rootfs/tmp/ticks");
    const lines = () => (existsSync(ticks) ? readFileSync(ticks, "utf8").split("\n").length : 0);
    await new Promise((r) => setTimeout(r, 300));
    await driver.hibernate(vm);
    const stateOf = (p: number) => readFileSync(`/proc/${p}/stat`, "utf8").split(") ")[1]![0];
    // SIGSTOP lands when the process next enters the kernel: on a busy machine a moment after the signal was sent.
    const stopBy = Date.now() + 2000;
    while (stateOf(host) !== "T" && Date.now() < stopBy) await new Promise((r) => setTimeout(r, 10));
    expect(stateOf(host)).toBe("T");
    const frozen = lines();
    await new Promise((r) => setTimeout(r, 400));
    expect(lines()).toBe(frozen);
    vm = (await driver.wake(spec)).vm;
    await new Promise((r) => setTimeout(r, 400));
    expect(lines()).toBeGreaterThan(frozen);
    const proc = JSON.parse((await execRequest(t, "GET", `/v1/procs/${pid}`)).body.toString());
    expect(proc).toMatchObject({ pid, state: "running" });
    await driver.stop(vm);
    await new Promise((r) => setTimeout(r, 300));
    expect(processAlive(host)).toBe(false);
    await expect(execRequest(t, "GET", "/v1/version", undefined, { timeoutMs: 2000 })).rejects.toThrow();
  });

  it("kill -9 of the fleet-agent: the exec server, a background process and what that one daemonised are gone within 3 s", async () => {
    const s: VmSpec = { ...spec, vmId: "vm_execkilled", agentId: "agt_execkilled", stateDir: join(work, "vms", "execkilled") };
    // A stand-in fleet-agent: the driver in a process of its own, which boots the agent, starts its exec server and is
    // then killed -9.
    const { host: parent, answer: target } = await bootInStandInHost<ExecTarget>(work, { bootTimeoutMs: 10_000 }, s, "await d.execTarget(vm)");
    const root = join(s.stateDir, "rootfs");
    const inRoot = () =>
      readdirSync("/proc").filter((p) => {
        try {
          return /^\d+$/.test(p) && readlinkSync(`/proc/${p}/root`) === root && processAlive(Number(p));
        } catch {
          return false;
        }
      });
    try {
      await killedHostLeavesNothing(parent, target, inRoot);
    } finally {
      // A failure's leftovers: the stand-in host shares this worker's stderr, and a process left holding it keeps the
      // test run's output open after the run.
      parent.kill("SIGKILL");
      for (const p of inRoot()) process.kill(Number(p), "SIGKILL");
    }
  });
});

/** The body of the kill -9 test: a background process and its daemonised child, then the stand-in host killed. */
async function killedHostLeavesNothing(parent: ChildProcess, target: ExecTarget, inRoot: () => string[]): Promise<void> {
  const bg = await execRequest(
    target,
    "POST",
    "/v1/exec",
    encodeSpec({ cmd: ["/bin/sh", "-c", "(setsid sleep 603 </dev/null >/dev/null 2>&1 &); exec sleep 604"], background: true }),
  );
  expect(bg.status).toBe(201);
  // A process listed a moment ago may have ended since (the shell that started the daemon).
  const cmdOf = (p: string) => {
    try {
      return readFileSync(`/proc/${p}/cmdline`, "utf8").split("\0").join(" ").trim();
    } catch {
      return "";
    }
  };
  let before: string[] = [];
  const deadline = Date.now() + 5000;
  while (!["sleep 603", "sleep 604"].every((c) => (before = inRoot()).some((p) => cmdOf(p) === c)) && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 20));
  expect(before.map(cmdOf)).toEqual(expect.arrayContaining(["sleep 603", "sleep 604"]));
  parent.kill("SIGKILL");
  const gone = Date.now() + 3000;
  while (before.some((p) => processAlive(Number(p))) && Date.now() < gone) await new Promise((r) => setTimeout(r, 20));
  const left = before.filter((p) => processAlive(Number(p)));
  expect(left).toEqual([]);
}

describe.skipIf(skip)("guest-exec on the process driver, the demo workload", () => {
  it("serves files in an empty root of the VM's own (nothing of the host's), and ends with the VM", async () => {
    const work = mkdtempSync(join(tmpdir(), "exec-process-demo-"));
    const driver = new ProcessDriver({ bootTimeoutMs: 15_000 });
    try {
      const spec: VmSpec = {
        vmId: "vm_execdemo",
        agentId: "agt_execdemo",
        image: "demo",
        vcpus: 1,
        memMiB: 128,
        allowEgress: false,
        stateDir: join(work, "vm"),
      };
      const { vm } = await driver.boot(spec);
      const t = await driver.execTarget(vm);
      expect((await execRequest(t, "PUT", "/v1/files?path=/notes/a&mkdirs=1", "x")).status).toBe(201);
      expect(readFileSync(join(spec.stateDir, "exec-root/notes/a"), "utf8")).toBe("x");
      expect((await execRequest(t, "GET", "/v1/files?path=/etc/passwd")).status).toBe(404);
      expect((await execRun(t, { cmd: ["sh", "-c", "true"] })).errors).toEqual(["not found: sh"]);
      await driver.stop(vm);
      await expect(execRequest(t, "GET", "/v1/version", undefined, { timeoutMs: 2000 })).rejects.toThrow();
    } finally {
      await driver.close();
      rmSync(work, { recursive: true, force: true });
    }
  });
});
