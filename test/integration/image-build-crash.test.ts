// kill -9 of a build at each phase (buildah running, export, unpack, the ext4 being written): nothing half-registered
// is ever readable, and what the dead build left is swept at the next start, after which the same build succeeds.
import { spawn } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../../lib/log.ts";
import { systemClock } from "../../lib/clock.ts";
import { buildImage } from "../../images/build/index.ts";
import { readArtifact } from "../../images/build/store.ts";
import { buildahRun, buildahSetup } from "../../images/build/buildah.ts";
import { toolPath } from "../../images/build/tools.ts";
import { createNodeImageBuilder } from "../../images/node-builder.ts";
import { makeRootfsFixture } from "../helpers/rootfs-fixture.ts";

const missing = (["buildah", "umoci", "mke2fs"] as const).filter((t) => !toolPath(t));
const why = missing.length > 0 ? `${missing.join(", ")} missing` : process.getuid?.() !== 0 ? "buildah runs as root here" : undefined;
const child = join(import.meta.dirname, "image-build-crash-child.ts");

let scratch: string;
let context: string;
/** buildah's storage of this file alone (the image is FROM scratch: no base needed), so no other test's build shares it. */
let cacheDir: string;

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), "image-crash-"));
  cacheDir = join(scratch, "cache");
  const fixture = makeRootfsFixture();
  context = join(scratch, "ctx");
  cpSync(fixture.dir, join(context, "root"), { recursive: true, verbatimSymlinks: true });
  fixture.remove();
  writeFileSync(
    join(context, "Containerfile"),
    'FROM scratch\nCOPY root/ /\nRUN ["/bin/busybox", "dd", "if=/dev/urandom", "of=/data/blob", "bs=1M", "count=24"]\nCMD ["/bin/httpd", "-f", "-p", "8080"]\n',
  );
});
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** Runs the child until its event matches `at`, then kill -9; answers the events it printed. */
function buildUntil(dataDir: string, at: (e: { type: string; phase?: string; text?: string }) => boolean): Promise<{ killed: boolean; events: unknown[] }> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [child, context, dataDir, cacheDir], { stdio: ["ignore", "pipe", "pipe"] });
    const events: unknown[] = [];
    let killed = false;
    let stderr = "";
    p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    createInterface({ input: p.stdout }).on("line", (line) => {
      const e = JSON.parse(line) as { type: string; phase?: string };
      events.push(e);
      if (!killed && at(e)) {
        killed = true;
        p.kill("SIGKILL");
      }
    });
    p.on("error", reject);
    p.on("close", (code) => (killed || code === 0 ? resolve({ killed, events }) : reject(new Error(`child exited ${code}: ${stderr}`))));
  });
}

/** Every image directory under the data dir is whole (readable), or there are none. */
function committed(dataDir: string): string[] {
  const root = join(dataDir, "images", "sha256");
  if (!existsSync(root)) return [];
  return readdirSync(root).map((hex) => {
    expect(readArtifact(dataDir, `sha256:${hex}`), `images/sha256/${hex} is half an image`).toBeDefined();
    return hex;
  });
}

const leftovers = (dataDir: string) => (existsSync(join(dataDir, "images")) ? readdirSync(join(dataDir, "images")).filter((n) => n.startsWith(".tmp-")) : []);
const buildContainers = async () => (await buildahRun(buildahSetup(cacheDir), ["containers", "--all", "--format", "{{.ContainerName}}"])).tail.filter(Boolean);

describe.skipIf(why !== undefined && process.env.CI !== "true")(`kill -9 in the middle of an image build${why ? ` — skipped: ${why}` : ""}`, () => {
  const points: [string, (e: { type: string; phase?: string; text?: string }) => boolean][] = [
    ["while buildah runs a step", (e) => e.type === "step" && (e as { text?: string }).text?.startsWith("RUN") === true],
    ["while the image is exported", (e) => e.type === "progress" && e.phase === "export"],
    ["while the layers are unpacked", (e) => e.type === "progress" && e.phase === "unpack"],
    ["while the ext4 is written", (e) => e.type === "progress" && e.phase === "rootfs" && e.text === "making the ext4 root filesystem"],
  ];

  for (const [when, at] of points) {
    it(`${when}: nothing half-made is readable; the next start sweeps it; the build then succeeds`, { timeout: 180_000 }, async () => {
      const dataDir = mkdtempSync(join(scratch, "data-"));
      const { killed } = await buildUntil(dataDir, at);
      expect(killed).toBe(true);
      committed(dataDir); // a commit is one rename: whatever is there is whole
      const left = await buildContainers();
      if (when.startsWith("while buildah")) expect(left.length, "a build killed mid-step leaves its working container").toBeGreaterThan(0);
      // The next start of a builder on this data dir sweeps what the dead one left.
      createNodeImageBuilder({ dataDir, cacheDir, clock: systemClock, log: silentLogger });
      expect(leftovers(dataDir)).toEqual([]);
      // buildah's working containers of the dead build are gone after the sweep (it runs in the background).
      await new Promise((r) => setTimeout(r, 3000));
      expect(await buildContainers()).toEqual([]);
      const images = await buildahRun(buildahSetup(cacheDir), ["images", "--all", "--quiet"]);
      expect(images.stdout.trim()).toBe("");
      const artifact = await buildImage({ kind: "containerfile", input: context, dataDir, cacheDir });
      expect(committed(dataDir)).toContain(artifact.digest.slice(7));
      rmSync(dataDir, { recursive: true, force: true });
    });
  }
});
