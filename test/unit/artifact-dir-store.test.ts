// The directory artifact store: round trips by digest, every read verified (store and cache), concurrent puts of one
// blob, sparse files kept sparse both ways, and a writer killed with SIGKILL mid-put leaving only a temp file.
import { spawn, execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync, writeSync, closeSync, ftruncateSync } from "node:fs";
import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { createDirArtifactStore } from "../../fleet-agent/artifacts/dir-store.ts";
import { sha256File } from "../../fleet-agent/drivers/common/snapshot-files.ts";
import { sbin } from "../helpers/sbin.ts";

const root = mkdtempSync(join(tmpdir(), "artifacts-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let seq = 0;
const fresh = (name: string) => join(root, `${name}-${++seq}`);
const sha = (path: string) => `sha256:${createHash("sha256").update(readFileSync(path)).digest("hex")}`;
/** Bytes a file occupies on disk (st_blocks of 512 bytes). */
const allocated = (path: string) => statSync(path).blocks * 512;
const MiB = 1 << 20;

/** A sparse file of `size` bytes with 1 MiB of random bytes at each of `at` (MiB offsets): the rest are holes. */
function sparseFile(path: string, size: number, at: number[]): void {
  const fd = openSync(path, "w");
  for (const mib of at) writeSync(fd, randomBytes(MiB), 0, MiB, mib * MiB);
  ftruncateSync(fd, size);
  closeSync(fd);
}

/** Every file under `dir`, recursively (relative paths). */
function filesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name));
}

describe("the directory artifact store", () => {
  it("puts a file under its sha256 and gets it back byte for byte; a second put adds nothing", async () => {
    const store = createDirArtifactStore({ root: fresh("store") });
    const src = fresh("src");
    writeFileSync(src, Buffer.concat([randomBytes(100_000), Buffer.alloc(200_000), randomBytes(33)]));
    const put = await store.put(src);
    expect(put).toEqual({ digest: sha(src), bytes: 300_033, added: true, written: expect.any(Number) });
    // The zero run between the random parts spans whole 64 KiB blocks: they are holes, not writes.
    expect(put.written).toBeLessThan(300_033 - 65_536);
    expect(put.written).toBeGreaterThanOrEqual(100_033);
    expect(store.blobPath(put.digest)).toBe(join(store.root, "blobs", "sha256", put.digest.slice(7, 9), put.digest.slice(7)));
    expect(await store.has(put.digest)).toBe(true);
    expect(await store.has(`sha256:${"0".repeat(64)}`)).toBe(false);
    expect(await store.put(src)).toEqual({ ...put, added: false, written: 0 });

    const dest = fresh("dest");
    await store.get(put.digest, dest);
    expect(readFileSync(dest).equals(readFileSync(src))).toBe(true);
    expect(filesUnder(join(store.root, "tmp"))).toEqual([]);

    // The empty file is a blob too.
    const empty = fresh("empty");
    writeFileSync(empty, "");
    const e = await store.put(empty);
    await store.get(e.digest, fresh("empty-back"));
    expect(e.digest).toBe("sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");

    await expect(store.get(`sha256:${"ab".repeat(32)}`, fresh("none"))).rejects.toMatchObject({ code: "not_found" });
    await expect(store.get("sha256:../../etc/passwd", fresh("bad"))).rejects.toMatchObject({ code: "bad_request" });
  });

  it("refuses a blob corrupted in the store: the destination is not written, nothing is left beside it", async () => {
    const store = createDirArtifactStore({ root: fresh("store") });
    const src = fresh("src");
    writeFileSync(src, randomBytes(3 * MiB));
    const { digest } = await store.put(src);
    const blob = store.blobPath(digest);
    const bytes = readFileSync(blob);
    bytes[2 * MiB + 7]! ^= 0x40; // one bit flipped in the store
    writeFileSync(blob, bytes);
    const outDir = fresh("out");
    execFileSync("mkdir", [outDir]);
    await expect(store.get(digest, join(outDir, "ram"))).rejects.toMatchObject({ code: "internal", message: expect.stringMatching(/corrupt in the store/) });
    expect(readdirSync(outDir)).toEqual([]);
  });

  it("fills the cache on a read and uses it; a corrupted cache entry is not used but replaced from the store", async () => {
    const cacheDir = fresh("cache");
    const store = createDirArtifactStore({ root: fresh("store"), cacheDir });
    const src = fresh("src");
    writeFileSync(src, randomBytes(MiB));
    const { digest } = await store.put(src);
    expect(filesUnder(cacheDir)).toEqual([]); // put does not fill the cache: the writer has its own copy
    await store.get(digest, fresh("first"));
    const cached = join(cacheDir, "sha256", digest.slice(7, 9), digest.slice(7));
    expect(sha(cached)).toBe(digest);

    // The cache is used: with the store's blob gone, a read still answers from it.
    const blob = store.blobPath(digest);
    const stored = readFileSync(blob);
    rmSync(blob);
    const fromCache = fresh("from-cache");
    await store.get(digest, fromCache);
    expect(sha(fromCache)).toBe(digest);

    // A corrupted entry is refused: with no blob in the store to fall back on, the read fails rather than use it.
    const bad = Buffer.from(readFileSync(cached));
    bad[12345]! ^= 1;
    writeFileSync(cached, bad);
    const refused = fresh("refused");
    await expect(store.get(digest, refused)).rejects.toMatchObject({ code: "not_found" });
    expect(existsSync(refused)).toBe(false);
    expect(existsSync(cached)).toBe(false);

    // With the blob back, a corrupted entry is replaced by the store's verified copy.
    writeFileSync(blob, stored);
    await store.get(digest, fresh("refill"));
    writeFileSync(cached, bad);
    const healed = fresh("healed");
    await store.get(digest, healed);
    expect(sha(healed)).toBe(digest);
    expect(sha(cached)).toBe(digest);
  });

  it("concurrent puts of the same file all succeed with one blob; of different files, each its own", async () => {
    const store = createDirArtifactStore({ root: fresh("store") });
    const src = fresh("src");
    writeFileSync(src, randomBytes(4 * MiB));
    const other = fresh("other");
    writeFileSync(other, randomBytes(MiB));
    // Two stores over one root: two hosts on a shared directory.
    const second = createDirArtifactStore({ root: store.root });
    const puts = await Promise.all([store.put(src), second.put(src), store.put(src), second.put(other), store.put(src)]);
    const ofSrc = puts.filter((p) => p.digest === sha(src));
    expect(ofSrc).toHaveLength(4);
    expect(ofSrc.filter((p) => p.added)).toHaveLength(1);
    expect(puts[3]).toMatchObject({ digest: sha(other), added: true });
    expect(filesUnder(join(store.root, "blobs")).sort()).toEqual([store.blobPath(sha(src)), store.blobPath(sha(other))].sort());
    expect(filesUnder(join(store.root, "tmp"))).toEqual([]);
    expect(sha(store.blobPath(sha(src)))).toBe(sha(src));
  });

  it("keeps sparse files sparse: a 256 MiB RAM file and a 1 GiB ext4 disk take their data's blocks in the store, the cache and the copy", async () => {
    const cacheDir = fresh("cache");
    const store = createDirArtifactStore({ root: fresh("store"), cacheDir });
    const ram = fresh("ram");
    sparseFile(ram, 256 * MiB, [0, 1, 100, 255]);
    const disk = fresh("disk.ext4");
    execFileSync("truncate", ["-s", "1G", disk]);
    execFileSync(sbin("mkfs.ext4"), ["-q", "-F", disk]);
    const figures: Record<string, unknown>[] = [];
    for (const src of [ram, disk]) {
      const size = statSync(src).size;
      let t = performance.now();
      const put = await store.put(src);
      const putMs = performance.now() - t;
      const blob = store.blobPath(put.digest);
      const dest = fresh("back");
      t = performance.now();
      await store.get(put.digest, dest); // from the store, filling the cache
      const getMs = performance.now() - t;
      const again = fresh("again");
      t = performance.now();
      await store.get(put.digest, again); // from the cache
      const cachedMs = performance.now() - t;
      expect(put.bytes).toBe(size);
      expect(put.written).toBeLessThanOrEqual(allocated(src));
      expect(statSync(dest).size).toBe(size);
      // Independent hashes (streamed: no 1 GiB buffer): the put's digest is the source's, the copy has the same bytes.
      expect(`sha256:${(await sha256File(src)).sha256}`).toBe(put.digest);
      expect(`sha256:${(await sha256File(dest)).sha256}`).toBe(put.digest);
      // Holes stay holes: no copy takes more than the source's blocks plus a little (filesystem metadata granularity).
      const slack = 2 * MiB;
      for (const copy of [blob, dest, again, join(cacheDir, "sha256", put.digest.slice(7, 9), put.digest.slice(7))]) {
        expect(allocated(copy), copy).toBeLessThanOrEqual(allocated(src) + slack);
      }
      expect(allocated(blob)).toBeLessThan(size / 8);
      figures.push({
        file: src.includes("ram") ? "256 MiB RAM file, 4 MiB data" : "1 GiB ext4 disk",
        allocatedMiB: +(allocated(src) / MiB).toFixed(1),
        blobMiB: +(allocated(blob) / MiB).toFixed(1),
        writtenMiB: +(put.written / MiB).toFixed(1),
        putMs: Math.round(putMs),
        getMs: Math.round(getMs),
        getCachedMs: Math.round(cachedMs),
      });
    }
    console.log("artifact store, sparse files:", JSON.stringify(figures));
  }, 120_000);

  it("reads what it cannot map (a pipe) sequentially, to the same digest and holes", async () => {
    const store = createDirArtifactStore({ root: fresh("store") });
    const file = fresh("file");
    sparseFile(file, 64 * MiB, [3, 40]);
    const fifo = fresh("fifo");
    execFileSync("mkfifo", [fifo]);
    const feeding = (async () => {
      const pipe = await open(fifo, "w");
      await pipe.write(readFileSync(file));
      await pipe.close();
    })();
    const viaPipe = await store.put(fifo);
    await feeding;
    expect(viaPipe).toMatchObject({ digest: sha(file), bytes: 64 * MiB, added: true, written: 2 * MiB });
    expect(await store.put(file)).toMatchObject({ digest: sha(file), added: false });
    expect(allocated(store.blobPath(viaPipe.digest))).toBeLessThanOrEqual(allocated(file) + MiB);
  });

  it("a writer killed with SIGKILL mid-put leaves no blob, only its temp file, which sweepTemps removes", async () => {
    const store = createDirArtifactStore({ root: fresh("store") });
    const fifo = fresh("fifo");
    execFileSync("mkfifo", [fifo]);
    // The child puts from a pipe the test feeds: it is mid-put for as long as the pipe stays open.
    const url = pathToFileURL(join(import.meta.dirname, "..", "..", "fleet-agent", "artifacts", "dir-store.ts")).href;
    const code = `const { createDirArtifactStore } = await import(${JSON.stringify(url)}); await createDirArtifactStore({ root: ${JSON.stringify(store.root)} }).put(${JSON.stringify(fifo)}); console.log("finished");`;
    const child = spawn(process.execPath, ["--input-type=module", "-e", code], { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on("exit", (_code, signal) => resolve(signal)));
    const pipe = await open(fifo, "w");
    await pipe.write(randomBytes(3 * MiB));
    const tmp = join(store.root, "tmp");
    const deadline = Date.now() + 30_000;
    while (!(filesUnder(tmp).length === 1 && statSync(filesUnder(tmp)[0]!).size >= MiB)) {
      if (Date.now() > deadline) throw new Error("the child never started writing its temp file");
      await new Promise((r) => setTimeout(r, 20));
    }
    child.kill("SIGKILL");
    expect(await exited).toBe("SIGKILL");
    await pipe.close();
    expect(out).toBe("");
    expect(filesUnder(join(store.root, "blobs"))).toEqual([]);
    const left = filesUnder(tmp);
    expect(left).toHaveLength(1);
    // A live writer's file (younger than the age given) is kept; an old one goes.
    expect(await store.sweepTemps(60_000, Date.now())).toEqual([]);
    expect(await store.sweepTemps(60_000, Date.now() + 61_000)).toHaveLength(1);
    expect(filesUnder(tmp)).toEqual([]);
  }, 60_000);
});
