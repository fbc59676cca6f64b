// The shared store's garbage collector and a host's images over the store, on real Postgres and real files: what no row
// references goes once past the grace period (what a row references, or was put again lately, stays); an image a host
// lacks is fetched from the store, verified and committed; a host's images are trimmed least recently used first.
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ImageConfig } from "../../contracts/image.ts";
import { createDirArtifactStore, type DirArtifactStore } from "../../fleet-agent/artifacts/dir-store.ts";
import { collectGarbage } from "../../fleet-agent/artifacts/gc.ts";
import { referencedDigests } from "../../fleet-agent/artifacts/references.ts";
import { createHostImages } from "../../images/build/host-images.ts";
import { commitArtifact, makeTempDir, readArtifact, ROOTFS_FILE } from "../../images/build/store.ts";
import { newId } from "../../lib/ids.ts";
import { silentLogger } from "../../lib/log.ts";
import { agentCommits, agents, tenants } from "../../schema/core.ts";
import { images } from "../../schema/images.ts";
import { operations } from "../../schema/operations.ts";
import type { Database } from "../../schema/db.ts";
import { freshDatabase } from "../helpers/db.ts";
import { eq } from "drizzle-orm";

let database: Database;
const root = mkdtempSync(join(tmpdir(), "artifact-gc-"));
let store: DirArtifactStore;
const HOUR = 3_600_000;

beforeAll(async () => {
  database = await freshDatabase();
  await database.db.insert(tenants).values({ id: "ten_gc", name: "gc" });
  store = createDirArtifactStore({ root: join(root, "store") });
});
afterAll(async () => {
  await database?.close();
  rmSync(root, { recursive: true, force: true });
});

/** Puts `text` into the store as a blob and makes it look `ageMs` old; answers its digest. */
async function blob(text: string, ageMs = 2 * HOUR): Promise<string> {
  const file = join(root, `in-${newId("request")}`);
  writeFileSync(file, text);
  const { digest } = await store.put(file);
  age(digest, ageMs);
  return digest;
}
function age(digest: string, ageMs: number): void {
  const t = new Date(Date.now() - ageMs);
  utimesSync(store.blobPath(digest), t, t);
}
async function agentWithCommit(digest: string, deleted: boolean): Promise<string> {
  const id = newId("agent");
  await database.db.insert(agents).values({ id, tenantId: "ten_gc", name: "a", image: "demo", ...(deleted ? { deletedAt: new Date() } : {}) });
  await database.db.insert(agentCommits).values({
    agentId: id,
    hostId: "host_gc",
    generation: 1,
    files: { "state.bin": { digest, bytes: 1 } },
    bytes: 1,
    snapshotAt: new Date(),
  });
  return id;
}
const config: ImageConfig = { entrypoint: ["/bin/sh"], cmd: [], env: [], workdir: "/", user: "", uid: 0, gid: 0, port: 8080 };
async function imageRow(digest: string, sizeBytes: number): Promise<void> {
  await database.db.insert(images).values({
    id: newId("image"),
    tenantId: "ten_gc",
    name: `img-${digest.slice(7, 15)}`,
    tag: "latest",
    digest,
    sizeBytes,
    config,
    source: "archive",
    buildId: "build_x",
  });
}
const digests = async () => {
  const all: string[] = [];
  for await (const b of store.list()) all.push(b.digest);
  return all;
};
const gc = (dryRun = false) => collectGarbage({ store, referenced: () => referencedDigests(database.db), graceMs: HOUR, now: Date.now, dryRun });

describe("the store's garbage collector", () => {
  it("removes what no live agent's commit, image or kept body references once past the grace; keeps the rest", async () => {
    const live = await blob("live agent's snapshot");
    const gone = await blob("deleted agent's snapshot");
    const image = await blob("an image's root filesystem");
    const body = await blob("a kept upstream body");
    const orphan = await blob("nobody's");
    const young = await blob("just put, its row on the way", 60_000);
    await agentWithCommit(live, false);
    await agentWithCommit(gone, true);
    await imageRow(image, 26);
    await database.db.insert(operations).values({
      id: newId("operation"),
      tenantId: "ten_gc",
      agentId: "agt_gc",
      hostId: "host_gc",
      upstream: "model",
      method: "POST",
      path: "/v1/chat",
      requestHash: "0".repeat(64),
      mode: "sync",
      state: "succeeded",
      responseBody: body,
    } as typeof operations.$inferInsert);

    const dry = await gc(true);
    expect(dry).toMatchObject({ removed: 2, kept: 3, young: 1 });
    expect((await digests()).sort()).toEqual([live, gone, image, body, orphan, young].sort()); // a dry run removes nothing

    const r = await gc();
    expect(r).toMatchObject({ blobs: 6, removed: 2, kept: 3, young: 1 });
    expect(r.removedBytes).toBe("deleted agent's snapshot".length + "nobody's".length);
    expect((await digests()).sort()).toEqual([live, image, body, young].sort());
    expect(await store.has(gone)).toBe(false);
  });

  it("spares an old unreferenced blob that was put again since (a put of bytes already there touches it)", async () => {
    const again = await blob("put long ago, put again now");
    const file = join(root, "again");
    writeFileSync(file, "put long ago, put again now");
    expect((await store.put(file)).added).toBe(false);
    expect(Date.now() - (await store.mtimeOf(again))!).toBeLessThan(60_000);
    const r = await gc();
    expect(await store.has(again)).toBe(true);
    expect(r.removed).toBe(0);
  });
});

describe("a host's images over the store", () => {
  /** An image as a build leaves it under `dataDir` (a small file for its root filesystem), with its row. */
  async function builtImage(dataDir: string, text: string) {
    const tmp = makeTempDir(dataDir);
    writeFileSync(join(tmp, ROOTFS_FILE), text);
    const digest = `sha256:${createHash("sha256").update(text).digest("hex")}`;
    const artifact = commitArtifact(dataDir, tmp, { digest, sizeBytes: text.length, config });
    await imageRow(digest, text.length);
    return artifact;
  }
  const hostImages = (dataDir: string, opts: { maxBytes?: number; inUse?: Set<string> } = {}) =>
    createHostImages({
      dataDir,
      blobs: store,
      configOf: async (digest) => (await database.db.select().from(images).where(eq(images.digest, digest)).limit(1))[0],
      maxBytes: opts.maxBytes ?? 1 << 30,
      inUse: () => opts.inUse ?? new Set(),
      log: silentLogger,
    });

  it("publishes a build; another host fetches it verified, writes its image.json, and serves it from its own copy after", async () => {
    const gatewayDir = join(root, "gw");
    const built = await builtImage(gatewayDir, "rootfs of image one");
    await hostImages(gatewayDir).publish(built);
    expect(await store.has(built.digest)).toBe(true);

    const hostDir = join(root, "host-b");
    const b = hostImages(hostDir);
    expect(b.locate(built.digest)).toBeUndefined();
    const [one, two] = await Promise.all([b.ensure(built.digest), b.ensure(built.digest)]); // one fetch for both
    expect(one).toEqual(two);
    expect(one).toMatchObject({ digest: built.digest, sizeBytes: built.sizeBytes, config });
    expect(readFileSync(one!.rootfs, "utf8")).toBe("rootfs of image one");
    expect(readArtifact(hostDir, built.digest)).toEqual(one);
    expect(await b.ensure(`sha256:${"9".repeat(64)}`)).toBeUndefined(); // no row, nothing in the store
  });

  it("refuses a blob that does not hash to its name and leaves nothing behind", async () => {
    const dir = join(root, "gw2");
    const built = await builtImage(dir, "rootfs of image two");
    await hostImages(dir).publish(built);
    const blobPath = store.blobPath(built.digest);
    rmSync(blobPath);
    writeFileSync(blobPath, "tampered rootfs bytes!!");
    const c = hostImages(join(root, "host-c"));
    await expect(c.ensure(built.digest)).rejects.toMatchObject({ code: "internal" });
    expect(c.locate(built.digest)).toBeUndefined();
  });

  it("trims the least recently used images that are in the store and not running, down to the limit", async () => {
    const dir = join(root, "host-d");
    const a = await builtImage(dir, "a".repeat(64 * 1024));
    const b = await builtImage(dir, "b".repeat(64 * 1024));
    const local = await builtImage(dir, "c".repeat(64 * 1024)); // never published: this host has the only copy
    const d = hostImages(dir);
    await d.publish(a);
    await d.publish(b);
    const old = new Date(Date.now() - HOUR);
    for (const x of [a, b, local]) utimesSync(join(x.rootfs, "..", "image.json"), old, old);
    await d.ensure(a.digest); // used now: the most recent
    const trimmed = await hostImages(dir, { maxBytes: 150 * 1024, inUse: new Set() }).trim();
    expect(trimmed).toEqual([b.digest]);
    expect(existsSync(b.rootfs)).toBe(false);
    expect(existsSync(local.rootfs) && existsSync(a.rootfs)).toBe(true);
    // Running images stay whatever the limit; what goes comes back on its next use.
    expect(await hostImages(dir, { maxBytes: 64 * 1024, inUse: new Set([a.digest]) }).trim()).toEqual([]);
    expect((await d.ensure(b.digest))?.digest).toBe(b.digest);
  });
});
