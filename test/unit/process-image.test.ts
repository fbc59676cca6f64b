// The process driver's pieces for built images that need no root and no image: reading debugfs's listings, making
// directories inside an agent's copy without following its symlinks out, and building the launcher once under
// concurrency (with a stand-in compiler that counts its runs).
import { execFile, spawn } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { dyingWithUs } from "../../fleet-agent/drivers/common/vm-process.ts";
import { ensureLauncher } from "../../fleet-agent/drivers/process/launcher.ts";
import { encodeLaunchSpec } from "../../fleet-agent/guest/launch-spec.ts";
import { waitFor } from "../helpers/wait.ts";
import { mkdirInRoot, parseListings } from "../../fleet-agent/drivers/process/rootfs.ts";

const root = mkdtempSync(join(tmpdir(), "process-image-unit-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("debugfs listings", () => {
  it("one list per `ls -p` command, entries with inode, octal mode, owner and names with spaces; a failed ls is empty", () => {
    const out = [
      'debugfs: ls -p "/"',
      "/2/040755/0/0/.//",
      "/2/040755/0/0/..//",
      "/12/042755/0/0/a dir//",
      "/15/120777/1000/1000/abs-link/11/",
      "/17/041777/0/0/tmp//",
      "/0/000000/0/0//0/",
      "",
      'debugfs: ls -p "/gone"',
      'debugfs: ls -p "/a dir"',
      "/13/104755/0/0/tool/2/",
      "/14/010620/5/6/pipe/0/",
      "",
    ].join("\n");
    const [top, gone, sub] = parseListings(out);
    expect(top!.map((e) => e.name)).toEqual([".", "..", "a dir", "abs-link", "tmp"]);
    expect(top![2]).toEqual({ ino: 12, mode: 0o42755, uid: 0, gid: 0, name: "a dir" });
    expect(top![3]).toMatchObject({ mode: 0o120777, uid: 1000, gid: 1000 });
    expect(gone).toEqual([]);
    expect(sub).toEqual([
      { ino: 13, mode: 0o104755, uid: 0, gid: 0, name: "tool" },
      { ino: 14, mode: 0o10620, uid: 5, gid: 6, name: "pipe" },
    ]);
  });
});

describe("directories inside an agent's copy", () => {
  it("makes the missing parts, the last with its mode, and replaces a symlink instead of following it out", () => {
    const copy = join(root, "copy");
    const outside = join(root, "outside");
    mkdirSync(copy);
    mkdirSync(outside);
    symlinkSync(outside, join(copy, "run")); // an image's absolute link, which the host must not follow
    return mkdirInRoot(copy, "/run/agentvm/leases", 0o1777).then((made) => {
      expect(made).toBe(join(copy, "run/agentvm/leases"));
      expect(readdirSync(outside)).toEqual([]);
      expect(lstatSync(join(copy, "run")).isDirectory()).toBe(true);
      expect(lstatSync(join(copy, "run")).mode & 0o7777).toBe(0o755);
      expect(lstatSync(join(copy, "run/agentvm")).mode & 0o7777).toBe(0o755);
      expect(lstatSync(made).mode & 0o7777).toBe(0o1777);
    });
  });
});

describe("the launcher build", () => {
  /** A stand-in `cc` that logs each run, takes a while, and writes an executable where `-o` says. */
  function fakeCompiler(dir: string): { cc: string; runs: () => number } {
    mkdirSync(dir, { recursive: true });
    const log = join(dir, "runs.log");
    const cc = join(dir, "cc");
    writeFileSync(cc, `#!/bin/sh\necho "$@" >> '${log}'\nsleep 0.3\nwhile [ "$1" != -o ]; do shift; done\nprintf '#!/bin/sh\\n' > "$2"\nchmod 755 "$2"\n`);
    chmodSync(cc, 0o755);
    return { cc, runs: () => (existsSync(log) ? readFileSync(log, "utf8").trim().split("\n").length : 0) };
  }

  it("concurrent first uses share one build; the binary is named by the source's hash and no temporary file stays", async () => {
    const { cc, runs } = fakeCompiler(join(root, "cc1"));
    const source = join(root, "launch-a.c");
    writeFileSync(source, "int main(void) { return 0; }\n");
    const cache = join(root, "cache1");
    const paths = await Promise.all([1, 2, 3, 4].map(() => ensureLauncher(cache, { source, cc })));
    expect(new Set(paths).size).toBe(1);
    expect(paths[0]).toMatch(/\/launch-[0-9a-f]{16}$/);
    expect(runs()).toBe(1);
    expect(readdirSync(cache)).toEqual([paths[0]!.split("/").at(-1)]);
    // Built: later uses compile nothing; a changed source is a new binary.
    await ensureLauncher(cache, { source, cc });
    expect(runs()).toBe(1);
    writeFileSync(source, "int main(void) { return 1; }\n");
    const changed = await ensureLauncher(cache, { source, cc });
    expect(changed).not.toBe(paths[0]);
    expect(runs()).toBe(2);
  });

  it("fleet-agents building at once (separate processes) each rename a whole file into place; nothing partial stays", async () => {
    const { cc, runs } = fakeCompiler(join(root, "cc2"));
    const source = join(root, "launch-b.c");
    writeFileSync(source, "int main(void) { return 2; }\n");
    const cache = join(root, "cache2");
    const module = new URL("../../fleet-agent/drivers/process/launcher.ts", import.meta.url).href;
    const code = `const { ensureLauncher } = await import(${JSON.stringify(module)}); console.log(await ensureLauncher(${JSON.stringify(cache)}, { source: ${JSON.stringify(source)}, cc: ${JSON.stringify(cc)} }));`;
    const outputs = await Promise.all(
      [1, 2, 3].map(
        () =>
          new Promise<string>((resolve, reject) =>
            execFile(process.execPath, ["--input-type=module", "-e", code], (err, stdout, stderr) =>
              err ? reject(new Error(stderr || err.message)) : resolve(stdout.trim()),
            ),
          ),
      ),
    );
    expect(new Set(outputs).size).toBe(1);
    expect(runs()).toBeGreaterThanOrEqual(1); // each process may build; the last rename wins with the same bytes
    expect(readdirSync(cache)).toEqual([outputs[0]!.split("/").at(-1)]);
    expect(readFileSync(outputs[0]!, "utf8")).toBe("#!/bin/sh\n");
  });

  it("an entrypoint started under the parent-death signal keeps it past the drop to the image's user: it dies with the fleet-agent", async () => {
    const launcher = await ensureLauncher(join(root, "real-launcher"));
    const fs = join(root, "pdeath-root");
    mkdirSync(join(fs, "bin"), { recursive: true });
    copyFileSync("/bin/busybox", join(fs, "bin", "busybox"));
    chmodSync(join(fs, "bin", "busybox"), 0o755);
    const spec = join(root, "pdeath.spec");
    const config = { entrypoint: ["/bin/busybox"], cmd: ["sleep", "600"], env: [], workdir: "/", user: "65534:65534", uid: 65534, gid: 65534, port: 8080 };
    writeFileSync(spec, encodeLaunchSpec(config, []));
    // A stand-in fleet-agent starts it as the process driver does (vm-process.ts `dyingWithUs`), then is killed -9.
    const [command, args] = dyingWithUs(launcher, [fs, spec]);
    const parent = spawn(
      process.execPath,
      [
        "-e",
        `const c = require("node:child_process").spawn(${JSON.stringify(command)}, ${JSON.stringify(args)}, { stdio: "ignore", detached: true }); console.log(c.pid); setInterval(() => {}, 1000);`,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    const pid = Number(await new Promise<string>((resolve) => parent.stdout!.once("data", (c: Buffer) => resolve(c.toString().trim()))));
    await waitFor(
      () => (readFileSync(`/proc/${pid}/status`, "utf8").match(/^Uid:\s+(\d+)/m)?.[1] ?? "") === "65534",
      5000,
      "the entrypoint running as the image's user",
    );
    parent.kill("SIGKILL");
    await waitFor(
      () => !existsSync(`/proc/${pid}`) || /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, "utf8")),
      5000,
      "the entrypoint gone with its parent",
    );
  });

  it("no compiler: a clear error naming what to install", async () => {
    const source = join(root, "launch-c.c");
    writeFileSync(source, "int main(void) { return 3; }\n");
    await expect(ensureLauncher(join(root, "cache3"), { source, cc: join(root, "no-such-cc") })).rejects.toThrow(
      /no-such-cc is not installed \(apt-get install gcc libc6-dev\)/,
    );
    expect(readdirSync(join(root, "cache3"))).toEqual([]);
  });
});
