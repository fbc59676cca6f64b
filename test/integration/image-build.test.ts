// images/build with the real tools: the Node base, the example agent's Containerfile, OCI and docker archives, and every way a build fails leaving nothing behind.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import { imageDir, type ImageConfig } from "../../contracts/image.ts";
import { archiveFormatsOf } from "../../images/build/archive.ts";
import { aptMirror, baseFor, baseNames, ensureBase, fromImages } from "../../images/build/base.ts";
import {
  buildahBuild,
  buildahImageLabels,
  buildahPushArchive,
  buildahRemoveImage,
  buildahRun,
  buildahSetup,
  parseStep,
  sweepBuildah,
} from "../../images/build/buildah.ts";
import { buildImage, type BuildEvent, type BuildRequest } from "../../images/build/index.ts";
import { usedInodes } from "../../images/build/rootfs.ts";
import { readArtifact, removeArtifact, sweepTemp } from "../../images/build/store.ts";
import { ensureImageTools, imageTools, toolPath, type ImageTool } from "../../images/build/tools.ts";
import { imagePort, resolveUser } from "../../images/build/unpack.ts";
import { sbin } from "../helpers/sbin.ts";

const repo = join(import.meta.dirname, "..", "..");
// Bases and buildah's storage are kept across runs (a cold Node base is a minute of debootstrap).
const cacheDir = process.env.AGENTVM_CACHE_DIR ?? join(homedir(), ".cache", "agentvm");
const ci = process.env.CI === "true";
const missingTools = (Object.keys(imageTools) as ImageTool[]).filter((t) => !toolPath(t));
const why =
  missingTools.length > 0
    ? `${missingTools.join(", ")} missing (apt-get install -y buildah skopeo umoci debootstrap)`
    : process.getuid?.() !== 0
      ? "buildah and umoci run as root here"
      : undefined;
if (why && ci) throw new Error(`CI: image builds cannot run: ${why} (npm test provisions the tools: scripts/provision.ts)`);
const title = `image builds with buildah, skopeo, umoci and mke2fs${why ? ` — skipped: ${why}` : ""}`;

/** Every path under `<dataDir>/images`, to compare before and after a failed build. */
function tree(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    let names: string[] = [];
    try {
      names = readdirSync(d);
    } catch {
      return;
    }
    for (const n of names.sort()) {
      out.push(join(d, n));
      if (statSync(join(d, n)).isDirectory()) walk(join(d, n));
    }
  };
  walk(dir);
  return out;
}

function debugfs(image: string, command: string): string {
  const r = spawnSync(toolPath("debugfs")!, ["-R", command, image], { encoding: "utf8" });
  return r.stdout;
}

async function failure(req: BuildRequest): Promise<AppError> {
  const err = await buildImage(req).then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  return err as AppError;
}

describe("pieces of the build (no tools)", () => {
  it("parses buildah's steps, FROM lines, archive roots, ports and users", () => {
    expect(parseStep("STEP 3/5: RUN npm ci")).toEqual({ step: 3, total: 5, text: "RUN npm ci" });
    expect(parseStep("[1/2] STEP 1/4: FROM golang AS build")).toEqual({ step: 1, total: 4, text: "[1/2] FROM golang AS build" });
    expect(parseStep("COMMIT x")).toBeUndefined();
    expect(fromImages("# x\nfrom --platform=linux/amd64 agentvm/node:bookworm AS b\nRUN x \\\n FROM y\nFROM b\n")).toEqual(["agentvm/node:bookworm", "b"]);
    expect(baseFor("agentvm/node:bookworm")?.include).toEqual(["nodejs"]);
    expect(baseFor("localhost/agentvm/python")?.include).toEqual(["python3"]);
    expect(baseFor("node:22-slim")).toBeUndefined();
    expect(baseFor("agentvm/node:bullseye")).toBeUndefined();
    expect(archiveFormatsOf(["./oci-layout", "./index.json", "./blobs/"])).toEqual(["oci-archive"]);
    expect(archiveFormatsOf(["manifest.json", "abc.json", "abc/layer.tar"])).toEqual(["docker-archive"]);
    expect(archiveFormatsOf(["oci-layout", "index.json", "manifest.json"])).toEqual(["oci-archive", "docker-archive"]);
    expect(archiveFormatsOf(["hello.txt"])).toEqual([]);
    expect(imagePort(undefined)).toBe(8080);
    expect(imagePort({ "53/udp": {}, "3000/tcp": {} })).toBe(3000);
    expect(imagePort({ "9000": {} })).toBe(9000);
    expect(imagePort({ "8080/tcp": {}, "9229/tcp": {} })).toBe(8080);
    expect(() => imagePort({ "3000/tcp": {}, "3001/tcp": {} })).toThrow(/several TCP ports/);
  });

  it("resolves USER in the image's own passwd and group, never following a link out of the root", () => {
    const root = mkdtempSync(join(tmpdir(), "image-user-"));
    try {
      mkdirSync(join(root, "etc"));
      writeFileSync(join(root, "etc/passwd"), "root:x:0:0::/root:/bin/sh\nagent:x:1234:1300::/home/agent:/bin/sh\n");
      writeFileSync(join(root, "etc/group"), "root:x:0:\nstaff:x:1300:\nweb:x:1400:\n");
      expect(resolveUser(root, "")).toEqual({ uid: 0, gid: 0 });
      expect(resolveUser(root, "agent")).toEqual({ uid: 1234, gid: 1300 });
      expect(resolveUser(root, "agent:web")).toEqual({ uid: 1234, gid: 1400 });
      expect(resolveUser(root, "1234")).toEqual({ uid: 1234, gid: 1300 });
      expect(resolveUser(root, "1000:1000")).toEqual({ uid: 1000, gid: 1000 });
      expect(resolveUser(root, "4242")).toEqual({ uid: 4242, gid: 0 });
      expect(() => resolveUser(root, "nobody")).toThrow(expect.objectContaining({ code: "build_failed" }));
      expect(() => resolveUser(root, "agent:nogroup")).toThrow(expect.objectContaining({ code: "build_failed" }));
      // /etc/passwd as an absolute link to the host's: read inside the root, where it does not exist.
      rmSync(join(root, "etc/passwd"));
      spawnSync("ln", ["-s", "/etc/passwd", join(root, "etc/passwd")]);
      expect(() => resolveUser(root, "root")).toThrow(/no user root/);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });

  it("reads the mirror from deb822 and one-line sources, and the used inodes from dumpe2fs", () => {
    const etc = mkdtempSync(join(tmpdir(), "image-apt-"));
    try {
      mkdirSync(join(etc, "sources.list.d"));
      writeFileSync(
        join(etc, "sources.list.d", "a.sources"),
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\nComponents: main\n\nTypes: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n",
      );
      writeFileSync(join(etc, "sources.list.d", "b.list.disabled"), "deb http://wrong.example/debian bookworm main\n");
      expect(aptMirror("bookworm", etc)).toBe("http://mirror.example/debian");
      writeFileSync(join(etc, "sources.list"), "# x\ndeb [arch=amd64] http://first.example/debian bookworm main contrib\n");
      expect(aptMirror("bookworm", etc)).toBe("http://first.example/debian");
      expect(aptMirror("trixie", etc)).toBe("http://deb.debian.org/debian");
    } finally {
      rmSync(etc, { recursive: true, force: true });
    }
    const dump =
      "Inode count:              16\nInodes per group:         8\nFree inodes:              9\nGroup 0: (Blocks 0-99)\n  Free inodes: 5-6, 8\nGroup 1: (Blocks 100-199)\n  Free inodes: 10-16\n";
    expect(usedInodes(dump)).toEqual([1, 2, 3, 4, 7, 9]);
  });
});

describe.skipIf(why !== undefined && !ci)(title, () => {
  let dataDir: string;
  let scratch: string;
  const images = () => join(dataDir, "images");

  beforeAll(() => {
    dataDir = mkdtempSync(join(tmpdir(), "image-data-"));
    scratch = mkdtempSync(join(tmpdir(), "image-scratch-"));
  });
  afterAll(() => {
    rmSync(dataDir, { recursive: true, force: true });
    rmSync(scratch, { recursive: true, force: true });
  });

  it("has every tool (ensureImageTools reports none missing)", () => {
    const lines: string[] = [];
    expect(ensureImageTools({ log: (l) => lines.push(l), install: () => false })).toEqual({ missing: [] });
  });

  it("makes the Node base once and answers it from the cache after", { timeout: 600_000 }, async () => {
    const spec = baseFor("agentvm/node:bookworm")!;
    const events: BuildEvent[] = [];
    const first = await ensureBase(spec, { cacheDir, onEvent: (e) => events.push(e) });
    expect(first.name).toBe("localhost/agentvm/node:bookworm");
    expect(statSync(join(first.rootfs, "usr/bin/node")).isFile()).toBe(true);
    // Cleaned like a container image: no downloaded packages, no device nodes, not the build host's name.
    expect(readdirSync(join(first.rootfs, "var/cache/apt/archives")).filter((n) => n.endsWith(".deb"))).toEqual([]);
    expect(readdirSync(join(first.rootfs, "dev"))).toEqual([]);
    expect(() => statSync(join(first.rootfs, "etc/hostname"))).toThrow();
    const setup = buildahSetup(cacheDir);
    for (const name of baseNames(spec)) expect((await buildahImageLabels(setup, name))?.labels["agentvm.base-key"]).toBe(first.key);

    const started = performance.now();
    const again = await ensureBase(spec, { cacheDir });
    expect({ built: again.built, committed: again.committed, key: again.key }).toEqual({ built: false, committed: false, key: first.key });
    expect(performance.now() - started).toBeLessThan(10_000);
  });

  it("builds examples/node-agent into an ext4 holding /app/server.js, with its config in image.json", { timeout: 300_000 }, async () => {
    const events: BuildEvent[] = [];
    const artifact = await buildImage({ kind: "containerfile", input: join(repo, "examples/node-agent"), dataDir, cacheDir, onEvent: (e) => events.push(e) });

    expect(artifact.config).toEqual({
      entrypoint: [],
      cmd: ["node", "/app/server.js"],
      env: expect.arrayContaining([expect.stringMatching(/^PATH=/)]),
      workdir: "/app",
      user: "",
      uid: 0,
      gid: 0,
      port: 8080,
      readyPath: "/",
    } satisfies ImageConfig);
    const dir = imageDir(dataDir, artifact.digest);
    expect(artifact.rootfs).toBe(join(dir, "rootfs.ext4"));
    const json = JSON.parse(readFileSync(join(dir, "image.json"), "utf8"));
    expect(Object.keys(json).sort()).toEqual(["config", "digest", "sizeBytes"]);
    expect(json).toEqual({ digest: artifact.digest, sizeBytes: artifact.sizeBytes, config: artifact.config });
    expect(readArtifact(dataDir, artifact.digest)).toEqual(artifact);
    const bytes = readFileSync(artifact.rootfs);
    expect(`sha256:${createHash("sha256").update(bytes).digest("hex")}`).toBe(artifact.digest);
    expect(bytes.length).toBe(artifact.sizeBytes);

    expect(debugfs(artifact.rootfs, "stat /app/server.js")).toMatch(/Type: regular/);
    expect(debugfs(artifact.rootfs, "cat /app/server.js")).toBe(readFileSync(join(repo, "examples/node-agent/server.js"), "utf8"));
    expect(debugfs(artifact.rootfs, "stat /workspace")).toMatch(/Type: directory/);
    expect(debugfs(artifact.rootfs, "stat /usr/bin/node")).toMatch(/Type: (regular|symlink)/);
    const fsck = spawnSync(sbin("e2fsck"), ["-fn", artifact.rootfs], { encoding: "utf8" });
    expect(fsck.status, fsck.stdout + fsck.stderr).toBe(0);
    const header = spawnSync(toolPath("dumpe2fs")!, ["-h", artifact.rootfs], { encoding: "utf8" }).stdout;
    expect(header).toMatch(/Filesystem volume name:\s+agentvm-image/);
    expect(header).not.toMatch(/has_journal/);

    // Steps as buildah numbered them, phases in order, and the log kept beside the image.
    const steps = events.filter((e) => e.type === "step");
    expect(steps.map((s) => s.step)).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(steps[0]).toEqual({ type: "step", step: 1, total: 7, text: "FROM agentvm/node:bookworm" });
    // Each step is told once: as a step, not again as buildah's log line (a client showed every step twice).
    expect(events.filter((e) => e.type === "log" && parseStep(e.line) !== undefined)).toEqual([]);
    const phases = [...new Set(events.flatMap((e) => (e.type === "progress" ? [e.phase] : [])))];
    expect(phases).toEqual(["base", "build", "export", "unpack", "rootfs"]);
    expect(readFileSync(join(dir, "build.log"), "utf8")).toContain("STEP 3/7: COPY server.js /app/server.js");
    // Nothing of the build is left: no temporary directory, no image in buildah's storage.
    expect(readdirSync(images()).filter((n) => n.startsWith(".tmp-"))).toEqual([]);
    const listed = await buildahRun(buildahSetup(cacheDir), ["images", "--all", "--format", "{{.Name}}"]);
    expect(listed.stdout).not.toContain("agentvm-build");
  });

  it("fails a bad Containerfile with build_failed and the log's tail, leaving nothing", { timeout: 180_000 }, async () => {
    const before = tree(images());
    const ctx = (name: string, containerfile: string) => {
      const d = join(scratch, name);
      mkdirSync(d, { recursive: true });
      writeFileSync(join(d, "Containerfile"), containerfile);
      writeFileSync(join(d, "hello.txt"), "hello\n");
      return d;
    };
    const run = await failure({
      kind: "containerfile",
      input: ctx("run", 'FROM agentvm/node:bookworm\nRUN echo about-to-fail && exit 3\nCMD ["node"]\n'),
      dataDir,
      cacheDir,
    });
    expect(run.code).toBe("build_failed");
    expect(run.message).toContain("about-to-fail");
    expect(run.message).toMatch(/exit status 3/);

    const started = performance.now();
    const pull = await failure({ kind: "containerfile", input: ctx("pull", 'FROM registry.invalid/none/such:1\nCMD ["x"]\n'), dataDir, cacheDir });
    expect(pull.code).toBe("build_failed");
    expect(pull.message).toMatch(/could not be pulled/);
    expect(pull.message).toContain("registry.invalid");
    expect(performance.now() - started).toBeLessThan(30_000);

    const syntax = await failure({ kind: "containerfile", input: ctx("syntax", "FROM scratch\nFROBNICATE x\n"), dataDir, cacheDir });
    expect(syntax.code).toBe("build_failed");
    expect(syntax.message).toMatch(/FROBNICATE/);

    const nocmd = await failure({ kind: "containerfile", input: ctx("nocmd", "FROM scratch\nCOPY hello.txt /hello.txt\n"), dataDir, cacheDir });
    expect(nocmd.code).toBe("build_failed");
    expect(nocmd.message).toMatch(/no ENTRYPOINT and no CMD/);

    const nofile = await failure({ kind: "containerfile", input: ctx("nofile", "FROM scratch\n"), file: "../elsewhere", dataDir, cacheDir });
    expect(nofile.code).toBe("build_failed");

    expect(tree(images())).toEqual(before);
    const listed = await buildahRun(buildahSetup(cacheDir), ["images", "--all", "--format", "{{.Name}}"]);
    expect(listed.stdout).not.toContain("agentvm-build");
    const containers = await buildahRun(buildahSetup(cacheDir), ["containers", "--all", "--format", "{{.ContainerName}}"]);
    expect(containers.stdout.trim()).toBe("");
  });

  describe("archives", () => {
    let ociArchive: string;
    let dockerArchive: string;
    const expected: ImageConfig = {
      entrypoint: ["/hello"],
      cmd: ["--greet"],
      env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hi"],
      workdir: "/srv",
      user: "agent",
      uid: 1234,
      gid: 1300,
      port: 9000,
      readyPath: "/healthz",
    };

    beforeAll(async () => {
      // A FROM scratch image of static files, made with buildah and pushed both ways.
      const ctx = join(scratch, "archive-ctx");
      mkdirSync(join(ctx, "etc"), { recursive: true });
      writeFileSync(join(ctx, "hello.txt"), "hello from an archive\n");
      writeFileSync(join(ctx, "etc/passwd"), "root:x:0:0::/root:/bin/sh\nagent:x:1234:1300::/srv:/bin/sh\n");
      writeFileSync(join(ctx, "etc/group"), "root:x:0:\nstaff:x:1300:\n");
      writeFileSync(
        join(ctx, "Containerfile"),
        'FROM scratch\nCOPY etc /etc\nCOPY hello.txt /srv/hello.txt\nENV GREETING=hi\nWORKDIR /srv\nUSER agent\nEXPOSE 9000/tcp\nEXPOSE 53/udp\nLABEL agentvm.ready-path=/healthz\nENTRYPOINT ["/hello"]\nCMD ["--greet"]\n',
      );
      const setup = buildahSetup(cacheDir, join(scratch, "buildah-tmp"));
      const tag = `localhost/agentvm-test/archive-${randomBytes(4).toString("hex")}:1`;
      await buildahBuild(setup, { contextDir: ctx, containerfile: join(ctx, "Containerfile"), tag, iidfile: join(scratch, "iid") });
      ociArchive = join(scratch, "image.oci.tar");
      dockerArchive = join(scratch, "image.docker.tar");
      try {
        await buildahPushArchive(setup, tag, ociArchive, "oci-archive");
        await buildahPushArchive(setup, tag, dockerArchive, "docker-archive", "agentvm-test/archive:1");
      } finally {
        await buildahRemoveImage(setup, tag);
      }
    }, 120_000);

    it("imports an OCI archive and a docker save tarball of one image with the same config", { timeout: 120_000 }, async () => {
      const started = performance.now();
      const events: BuildEvent[] = [];
      const oci = await buildImage({ kind: "archive", input: ociArchive, dataDir, cacheDir, onEvent: (e) => events.push(e) });
      const ociSeconds = (performance.now() - started) / 1000;
      const dockerLog: string[] = [];
      const docker = await buildImage({ kind: "archive", input: dockerArchive, dataDir, cacheDir, onEvent: (e) => e.type === "log" && dockerLog.push(e.line) });
      expect(oci.config).toEqual(expected);
      expect(docker.config).toEqual(expected);
      expect(debugfs(oci.rootfs, "cat /srv/hello.txt")).toBe("hello from an archive\n");
      expect(debugfs(docker.rootfs, "cat /srv/hello.txt")).toBe("hello from an archive\n");
      expect(readFileSync(join(imageDir(dataDir, oci.digest), "build.log"), "utf8")).toContain("imported an OCI archive");
      expect(dockerLog).toContain("agentvm: imported a docker save tarball");
      expect(events.flatMap((e) => (e.type === "progress" ? [e.phase] : []))).toEqual(expect.arrayContaining(["export", "unpack", "rootfs"]));
      // The same layer and config either way: the same bytes (UUID and hash seed come from them), so the second
      // import found the first one's files and kept them (and their build.log).
      expect(docker.digest).toBe(oci.digest);
      expect(readdirSync(join(images(), "sha256"))).toContain(oci.digest.slice(7));
      console.log(`OCI archive import: ${ociSeconds.toFixed(2)} s, ${oci.sizeBytes} bytes of ext4`);
    });

    it("is reproducible: the same archive into another data directory gives the same digest; a rebuild reuses it", { timeout: 120_000 }, async () => {
      const other = mkdtempSync(join(tmpdir(), "image-data2-"));
      try {
        const a = await buildImage({ kind: "archive", input: ociArchive, dataDir: other, cacheDir });
        const b = await buildImage({ kind: "archive", input: ociArchive, dataDir: other, cacheDir });
        expect(b.digest).toBe(a.digest);
        expect(readdirSync(join(other, "images", "sha256"))).toEqual([a.digest.slice(7)]);
        expect(readdirSync(join(other, "images")).filter((n) => n.startsWith(".tmp-"))).toEqual([]);
        const first = await buildImage({ kind: "archive", input: ociArchive, dataDir, cacheDir });
        expect(first.digest).toBe(a.digest);
        removeArtifact(other, a.digest);
        expect(readArtifact(other, a.digest)).toBeUndefined();
        expect(readdirSync(join(other, "images", "sha256"))).toEqual([]);
      } finally {
        rmSync(other, { recursive: true, force: true });
      }
    });

    it("refuses what is not a whole image archive with bad_archive, leaving nothing", { timeout: 120_000 }, async () => {
      const before = tree(images());
      const whole = readFileSync(ociArchive);
      const truncated = join(scratch, "truncated.tar");
      writeFileSync(truncated, whole.subarray(0, Math.floor(whole.length / 2)));
      const random = join(scratch, "random.bin");
      writeFileSync(random, randomBytes(64 * 1024));
      const plain = join(scratch, "plain.tar");
      spawnSync("tar", ["-c", "-f", plain, "-C", join(scratch, "archive-ctx"), "hello.txt"]);
      // A whole tar with a layer whose bytes no longer match its digest.
      const unpacked = join(scratch, "tampered");
      mkdirSync(unpacked);
      spawnSync("tar", ["-x", "-f", ociArchive, "-C", unpacked]);
      const blobs = join(unpacked, "blobs", "sha256");
      const biggest = readdirSync(blobs).sort((x, y) => statSync(join(blobs, y)).size - statSync(join(blobs, x)).size)[0]!;
      const blob = readFileSync(join(blobs, biggest));
      blob[blob.length - 100] = blob[blob.length - 100]! ^ 0xff;
      writeFileSync(join(blobs, biggest), blob);
      const tampered = join(scratch, "tampered.tar");
      spawnSync("tar", ["-c", "-f", tampered, "-C", unpacked, "."]);

      for (const [input, pattern] of [
        [truncated, /not a readable tar/],
        [random, /not a readable tar/],
        [plain, /neither an OCI archive/],
        [tampered, /could not be read|digest/i],
      ] as const) {
        const err = await failure({ kind: "archive", input, dataDir, cacheDir });
        expect(err.code, `${input}: ${err.message}`).toBe("bad_archive");
        expect(err.message).toMatch(pattern);
        expect(err.message).not.toContain(scratch); // no host paths in what a client reads
      }
      expect(tree(images())).toEqual(before);
    });

    it("stops on abort, removing its temporary directory; a sweep removes what dead builds left", { timeout: 60_000 }, async () => {
      const before = tree(images());
      const controller = new AbortController();
      const err = await buildImage({
        kind: "archive",
        input: ociArchive,
        dataDir,
        cacheDir,
        signal: controller.signal,
        onEvent: (e) => e.type === "progress" && e.phase === "unpack" && controller.abort(new Error("stop now")),
      }).catch((e: unknown) => e);
      expect((err as Error).message).toBe("stop now");
      expect(tree(images())).toEqual(before);

      const dead = join(images(), ".tmp-999999999-left");
      const ours = join(images(), `.tmp-${process.pid}-running`);
      mkdirSync(join(dead, "work"), { recursive: true });
      mkdirSync(ours);
      expect(sweepTemp(dataDir, () => false)).toEqual([dead]);
      expect(readdirSync(images())).toContain(`.tmp-${process.pid}-running`);
      rmSync(ours, { recursive: true });

      // A build result a dead process left in buildah's storage (here: one more name on the base) goes too.
      const setup = buildahSetup(cacheDir);
      const left = "localhost/agentvm-build/999999999-left:latest";
      expect((await buildahRun(setup, ["tag", "localhost/agentvm/node:bookworm", left])).code).toBe(0);
      expect(await sweepBuildah(cacheDir, (pid) => pid !== 999999999)).toEqual([left]);
      expect(await buildahImageLabels(setup, left)).toBeUndefined();
      expect(await buildahImageLabels(setup, "localhost/agentvm/node:bookworm")).toBeDefined();
    });
  });
});
