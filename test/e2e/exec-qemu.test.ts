// The exec server in a real QEMU VM (the demo guest, TCG here): the driver's execTarget, then the wire protocol over
// real HTTP through QEMU's forwarded port: version, key, foreground exec, a large stream under flow control, files,
// tar, escapes refused, a background process across hibernate and wake. One VM for every case; then a built image's
// VM, where the root is the overlay the entrypoint runs in and the user the image's.
import { request } from "node:http";
import { requestOptions } from "../../lib/node-net.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ExecTarget, RunningVm, VmSpec } from "../../fleet-agent/drivers/driver.ts";
import type { QemuDriver } from "../../fleet-agent/drivers/qemu/driver.ts";
import { encodeSpec, execRequest, execRun, execTty, listTar, makeTar, parseFrames, sh } from "../helpers/exec.ts";
import { makeDriver, makeSpec } from "../helpers/qemu.ts";
import { FIXTURE_UID, makeRootfsFixture, type RootfsFixture } from "../helpers/rootfs-fixture.ts";

describe("guest-exec in a QEMU demo VM", () => {
  let driver: QemuDriver;
  let spec: VmSpec;
  let vm: RunningVm;
  let t: ExecTarget;

  beforeAll(async () => {
    driver = await makeDriver();
    spec = makeSpec();
    vm = (await driver.boot(spec)).vm;
    t = await driver.execTarget(vm);
  }, 180_000);

  afterAll(async () => {
    await driver?.close();
    if (spec) await driver?.destroy(spec);
  });

  it("answers its version with the key, 401 with a wrong or missing one; the key is kept for the run", async () => {
    expect(t.host).toBe("127.0.0.1");
    expect(t.key).toMatch(/^[0-9a-f]{64}$/);
    expect(t.port).not.toBe(vm.endpoint.port);
    const v = await execRequest(t, "GET", "/v1/version");
    expect([v.status, v.body.toString()]).toEqual([200, "agentvm-exec/2"]);
    expect((await execRequest(t, "GET", "/v1/version", undefined, { key: "0".repeat(64) })).status).toBe(401);
    expect((await execRequest(t, "GET", "/v1/version", undefined, { key: null })).status).toBe(401);
    expect(await driver.execTarget(vm)).toEqual(t);
  });

  it("runs commands: output, exit code, signal, timeout, stdin, cwd, env, a missing command", async () => {
    const r = await execRun(t, { cmd: ["/bin/sh", "-c", 'echo out; echo err >&2; echo "$FOO"; pwd; exit 7'], env: { FOO: "bar" }, cwd: "/tmp" });
    expect([r.stdout.toString(), r.stderr.toString(), r.code]).toEqual(["out\nbar\n/tmp\n", "err\n", 7]);
    expect(r.exit).toMatch(/^code=7 ms=\d+$/);
    const killed = await execRun(t, { cmd: ["/bin/sh", "-c", "kill -TERM $$"] });
    expect([killed.code, killed.signal, killed.timedOut]).toEqual([null, 15, false]);
    const slow = await execRun(t, { cmd: ["sleep", "30"], timeoutMs: 500 });
    expect([slow.signal, slow.timedOut]).toEqual([9, true]);
    const cat = await execRun(t, { cmd: ["cat"], stdin: "hello\nstdin\n" });
    expect(cat.stdout.toString()).toBe("hello\nstdin\n");
    const missing = await execRun(t, { cmd: ["no-such-program"] });
    expect([missing.errors, missing.code]).toEqual([["not found: no-such-program"], 127]);
    const id = await sh(t, "id -u");
    expect(id.trim()).toBe("0");
    const bad = await execRequest(t, "POST", "/v1/exec", Buffer.from([0, 0, 0, 0]));
    expect(bad.status).toBe(400);
  });

  it("a client that goes away takes its command with it", async () => {
    const body = encodeSpec({ cmd: ["sleep", "301"] });
    await new Promise<void>((resolve) => {
      const req = request(
        { ...requestOptions(t), method: "POST", path: "/v1/exec", agent: false, headers: { "x-agentvm-exec-key": t.key, "content-length": body.length } },
        (res) => {
          res.resume();
          setTimeout(() => {
            req.destroy();
            resolve();
          }, 300);
        },
      );
      req.on("error", () => undefined);
      req.end(body);
    });
    let left = "x";
    for (let i = 0; i < 30 && left; i++) {
      left = await sh(t, "ps | grep 'sleep 30[1]' || true");
      if (left) await new Promise((r) => setTimeout(r, 100));
    }
    expect(left).toBe("");
  });

  it("streams 50 MiB read slowly while the server's memory stays small (flow control)", async () => {
    const total = 50 << 20;
    const body = encodeSpec({ cmd: ["dd", "if=/dev/zero", "bs=65536", `count=${total / 65536}`] });
    let received = 0;
    let exitFrame = "";
    const done = new Promise<void>((resolve, reject) => {
      const req = request(
        { ...requestOptions(t), method: "POST", path: "/v1/exec", agent: false, headers: { "x-agentvm-exec-key": t.key, "content-length": body.length } },
        (res) => {
          let tail = Buffer.alloc(0);
          let paused = 0;
          res.on("data", (c: Buffer) => {
            received += c.length;
            tail = Buffer.concat([tail, c]).subarray(-256);
            // Read slowly: a pause after every 4 MiB, so the guest's pipe and the socket fill up meanwhile.
            if (Math.floor(received / (4 << 20)) > paused) {
              paused++;
              res.pause();
              setTimeout(() => res.resume(), 300);
            }
          });
          res.on("end", () => {
            const at = tail.lastIndexOf(3);
            exitFrame = parseFrames(tail.subarray(at)).exit;
            resolve();
          });
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end(body);
    });
    // While it streams: every guest-exec process's peak RSS, read through another exec.
    const peaks: number[] = [];
    await new Promise((r) => setTimeout(r, 1500));
    for (let i = 0; i < 3 && received < total; i++) {
      const out = await sh(t, "for p in $(pidof guest-exec); do grep VmHWM /proc/$p/status; done");
      peaks.push(...[...out.matchAll(/VmHWM:\s+(\d+) kB/g)].map((m) => Number(m[1])));
      await new Promise((r) => setTimeout(r, 1000));
    }
    await done;
    expect(exitFrame).toMatch(/^code=0 /);
    // Frames: 5 bytes of header per read of at most 64 KiB.
    expect(received).toBeGreaterThan(total);
    expect(received).toBeLessThan(total + (total / 4096) * 5 + 1024);
    expect(peaks.length).toBeGreaterThan(0);
    expect(Math.max(...peaks)).toBeLessThan(4096); // KiB: a pipe's worth, not the stream
  }, 120_000);

  it("files: PUT with mode and owner, GET with headers, a listing, DELETE; mkdirs; a missing one is 404", async () => {
    const put = await execRequest(t, "PUT", "/v1/files?path=/srv/data/a.txt&mkdirs=1&mode=0640&uid=1000&gid=1001", "payload");
    expect(put.status).toBe(201);
    expect(JSON.parse(put.body.toString())).toEqual({ size: 7, mode: 0o640, uid: 1000, gid: 1001 });
    const get = await execRequest(t, "GET", "/v1/files?path=/srv/data/a.txt");
    expect(get.body.toString()).toBe("payload");
    expect(get.headers).toMatchObject({ "x-file-mode": "0640", "x-file-uid": "1000", "x-file-gid": "1001", "content-length": "7" });
    expect(await sh(t, "stat -c '%a %u %g' /srv/data/a.txt")).toBe("640 1000 1001\n");
    const list = JSON.parse((await execRequest(t, "GET", "/v1/files?path=/srv/data")).body.toString());
    expect(list.entries).toEqual([expect.objectContaining({ name: "a.txt", type: "file", size: 7, mode: 0o640, uid: 1000, gid: 1001 })]);
    // Replaced whole by rename; the default owner is the image's user (root for the demo).
    expect((await execRequest(t, "PUT", "/v1/files?path=/srv/data/a.txt", "v2")).status).toBe(201);
    expect(await sh(t, "cat /srv/data/a.txt; stat -c ' %a %u' /srv/data/a.txt")).toBe("v2 644 0\n");
    expect((await execRequest(t, "DELETE", "/v1/files?path=/srv/data")).status).toBe(409);
    expect((await execRequest(t, "DELETE", "/v1/files?path=/srv/data&recursive=1")).status).toBe(204);
    expect((await execRequest(t, "GET", "/v1/files?path=/srv/data/a.txt")).status).toBe(404);
    expect((await execRequest(t, "PUT", "/v1/files?path=/nope/x", "x")).status).toBe(404);
  });

  it("tar both ways: a tree out with modes and links, a tar in with owners kept", async () => {
    await sh(t, "mkdir -p /srv/t/sub && echo one > /srv/t/sub/one && chmod 600 /srv/t/sub/one && ln -s sub/one /srv/t/link");
    const out = await execRequest(t, "GET", "/v1/tar?path=/srv/t");
    expect(out.status).toBe(200);
    const entries = listTar(out.body);
    expect(entries.map((e) => e.name).sort()).toEqual(["t/", "t/link", "t/sub/", "t/sub/one"]);
    expect(entries.find((e) => e.name === "t/sub/one")).toMatchObject({ mode: 0o600, data: Buffer.from("one\n") });
    expect(entries.find((e) => e.name === "t/link")).toMatchObject({ type: "2", link: "sub/one" });
    const tar = makeTar([
      { name: "d", type: "dir", mode: 0o750, uid: 1000, gid: 1000 },
      { name: "d/f", data: "from tar", mode: 0o604, uid: 1000, gid: 1000 },
      { name: "rel", type: "symlink", link: "d/f" },
    ]);
    const put = await execRequest(t, "PUT", "/v1/tar?path=/srv/in", tar);
    expect([put.status, JSON.parse(put.body.toString())]).toEqual([201, { entries: 3 }]);
    expect(await sh(t, "stat -c '%a %u %g' /srv/in/d /srv/in/d/f; cat /srv/in/rel")).toBe("750 1000 1000\n604 1000 1000\nfrom tar");
  });

  it("refuses escapes: '..', protected places, hidden state, links out of a tar, device nodes", async () => {
    expect((await execRequest(t, "GET", "/v1/files?path=/tmp/../etc/passwd")).status).toBe(400);
    expect((await execRequest(t, "GET", "/v1/files?path=etc/passwd")).status).toBe(400);
    for (const path of ["/run/agentvm/x", "/proc/sys/kernel/hostname", "/sys/x", "/dev/x", "/sbin/guest-exec", "/run/guest-exec/key"]) {
      const a = await execRequest(t, "PUT", `/v1/files?path=${encodeURIComponent(path)}`, "x");
      expect([path, a.status, JSON.parse(a.body.toString()).code]).toEqual([path, 403, "forbidden_path"]);
    }
    expect((await execRequest(t, "DELETE", "/v1/files?path=/run&recursive=1")).status).toBe(403);
    // A symlink into a protected or hidden place is resolved first: the target decides.
    await sh(t, "ln -sfn /proc /tmp/p; ln -sfn /run/guest-exec /tmp/g");
    expect((await execRequest(t, "PUT", "/v1/files?path=/tmp/p/sys/kernel/hostname", "x")).status).toBe(403);
    expect((await execRequest(t, "GET", "/v1/files?path=/tmp/g/key")).status).toBe(403);
    expect((await execRequest(t, "GET", "/v1/files?path=/dev/console")).status).toBe(403);
    const bad = await execRequest(
      t,
      "PUT",
      "/v1/tar?path=/srv/bad",
      makeTar([
        { name: "ok", data: "1" },
        { name: "../escape", data: "x" },
        { name: "after", data: "x" },
      ]),
    );
    expect(bad.status).toBe(400);
    const abs = await execRequest(
      t,
      "PUT",
      "/v1/tar?path=/srv/bad2",
      makeTar([
        { name: "l", type: "symlink", link: "/etc" },
        { name: "l/passwd", data: "x" },
      ]),
    );
    expect(abs.status).toBe(400);
    expect(await sh(t, "ls /srv/bad; ls /srv/bad2; head -c 5 /etc/passwd")).toBe("ok\nroot:");
  });

  it("a background process runs on across hibernate and wake; its output, stdin, signal and wait", async () => {
    const started = await execRequest(
      t,
      "POST",
      "/v1/exec",
      encodeSpec({ cmd: ["/bin/sh", "-c", 'echo ready; while read line; do echo "got $line"; done; echo eof; sleep 600'], background: true, stdin: "" }),
    );
    expect(started.status).toBe(201);
    const { pid } = JSON.parse(started.body.toString()) as { pid: number };
    expect((await execRequest(t, "POST", `/v1/procs/${pid}/stdin`, "one\n")).status).toBe(204);
    const snap = await driver.hibernate(vm);
    expect(snap.completed).toBe(true);
    const woke = await driver.wake(spec);
    expect(woke.mode).toBe("restore");
    vm = woke.vm;
    const before = t;
    t = await driver.execTarget(vm);
    expect(t.key).not.toBe(before.key); // a new QEMU: a new key and port
    expect((await execRequest(t, "GET", "/v1/version", undefined, { key: before.key })).status).toBe(401);
    const proc = JSON.parse((await execRequest(t, "GET", `/v1/procs/${pid}`)).body.toString());
    expect(proc).toMatchObject({ pid, state: "running", cmd: ["/bin/sh", "-c", expect.stringContaining("echo ready")] });
    expect((await execRequest(t, "POST", `/v1/procs/${pid}/stdin?eof=1`, "two\n")).status).toBe(204);
    let text = "";
    for (let i = 0; i < 50 && !text.includes("eof"); i++) {
      text = (await execRequest(t, "GET", `/v1/procs/${pid}/output?stream=stdout`)).body.toString();
      if (!text.includes("eof")) await new Promise((r) => setTimeout(r, 100));
    }
    expect(text).toBe("ready\ngot one\ngot two\neof\n");
    const list = JSON.parse((await execRequest(t, "GET", "/v1/procs")).body.toString());
    expect(list.processes.map((p: { pid: number }) => p.pid)).toContain(pid);
    expect((await execRequest(t, "POST", `/v1/procs/${pid}/signal?sig=15`)).status).toBe(204);
    const waited = JSON.parse((await execRequest(t, "GET", `/v1/procs/${pid}/wait?timeout_ms=10000`)).body.toString());
    expect(waited).toMatchObject({ pid, state: "exited", exitCode: null, signal: 15 });
    const out = await execRequest(t, "GET", `/v1/procs/${pid}/output?stream=stdout&offset=6&limit=8`);
    expect([out.body.toString(), out.headers["x-next-offset"], out.headers["x-eof"], out.headers["x-dropped"]]).toEqual(["got one\n", "14", undefined, "0"]);
    const end = await execRequest(t, "GET", `/v1/procs/${pid}/output?stream=stdout&offset=14`);
    expect(end.headers["x-eof"]).toBe("1");
    expect((await execRequest(t, "GET", "/v1/procs/999999")).status).toBe(404);
  }, 120_000);

  it("exec round trip on the warm VM (p50 over 50 runs)", async () => {
    const ms: number[] = [];
    for (let i = 0; i < 50; i++) {
      const t0 = performance.now();
      await execRun(t, { cmd: ["true"] });
      ms.push(performance.now() - t0);
    }
    ms.sort((a, b) => a - b);
    console.log(`exec round trip (QEMU ${driver.accel}): p50 ${ms[25]!.toFixed(1)} ms, p90 ${ms[45]!.toFixed(1)} ms`);
    expect(ms[25]).toBeLessThan(2000);
  }, 120_000);
});

describe("guest-exec in a QEMU VM with a built image", () => {
  let fixture: RootfsFixture;
  let driver: QemuDriver;
  let spec: VmSpec;
  let t: ExecTarget;

  beforeAll(async () => {
    fixture = makeRootfsFixture();
    driver = await makeDriver();
    spec = makeSpec({ agentId: "agt_execimg", image: fixture.artifact.digest, rootImage: fixture.artifact, diskMiB: 64 });
    const { vm } = await driver.boot(spec);
    t = await driver.execTarget(vm);
  }, 180_000);

  afterAll(async () => {
    await driver?.close();
    if (spec) await driver?.destroy(spec);
    fixture?.remove();
  });

  it("runs in the entrypoint's root as the image's user with its environment; the guest's own files are out of reach", async () => {
    expect(await sh(t, 'echo "$(id -u) $AGENT_ID $PORT $(pwd)"')).toBe(`${FIXTURE_UID} agt_execimg 8081 /www\n`);
    expect(await sh(t, "id -u", { user: "root" })).toBe("0\n");
    // The image's files, not the initramfs's: no guest agent, no exec server, no key in this root.
    expect(await sh(t, "ls /sbin/guest-exec /run/guest-exec 2>&1; true")).toMatch(/No such file.*\n.*No such file/s);
    expect((await execRequest(t, "GET", "/v1/files?path=/run/guest-exec/key")).status).toBe(404);
    expect(await sh(t, "ls -d /run/agentvm/leases")).toBe("/run/agentvm/leases\n"); // the guest agent's, shared: read-only here
    expect((await execRequest(t, "PUT", "/v1/files?path=/run/agentvm/leases/x", "x")).status).toBe(403);
    const put = await execRequest(t, "PUT", "/v1/files?path=/data/from-exec.txt", "hello");
    expect(JSON.parse(put.body.toString())).toMatchObject({ uid: FIXTURE_UID, gid: FIXTURE_UID });
    expect(await sh(t, "cat /data/from-exec.txt")).toBe("hello");
  });

  it("a terminal in the entrypoint's root: a /dev/pts it sees, owned by the image's user, of the size given", async () => {
    const script = 'tty; stat -c %u "$(tty)"; stty size; exit 6';
    const r = await execTty(t, { cmd: ["/bin/sh", "-c", script], tty: { rows: 12, cols: 34 } }, []);
    const lines = r.stdout.toString().split("\r\n");
    expect(lines[0]).toMatch(/^\/dev\/pts\/\d+$/);
    expect(lines.slice(1, 3)).toEqual([String(FIXTURE_UID), "12 34"]);
    expect(r.code).toBe(6);
  });
});
