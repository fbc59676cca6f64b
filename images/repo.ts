// Image rows as the API reads and writes them (drizzle; Postgres or PGlite): one per tenant's name:tag.
import { and, asc, count, eq, isNull, sql } from "drizzle-orm";
import type { Db } from "../schema/db.ts";
import { agents } from "../schema/core.ts";
import { images } from "../schema/images.ts";
import { isImageDigest, type ImageCatalog, type ImageConfig, type ImageRecord } from "../contracts/image.ts";

export type ImageRow = typeof images.$inferSelect;
export type NewImage = Omit<typeof images.$inferInsert, "createdAt">;

export interface ImageRepo extends ImageCatalog {
  /** A page of the tenant's images by name then tag: at most `limit` rows after `after` (keyset on the unique (tenant, name, tag) index). */
  list(tenantId: string, opts: { limit: number; after?: { name: string; tag: string } }): Promise<ImageRow[]>;
  get(id: string): Promise<ImageRow | undefined>;
  /** Registers `name:tag` for the tenant, moving the tag when it named another digest before; the row as stored. */
  put(image: NewImage): Promise<ImageRow>;
  remove(id: string): Promise<void>;
  /** The config and size of the image of `digest` (any row naming it: every row of a digest has the same ones). */
  byDigest(digest: string): Promise<{ config: ImageConfig; sizeBytes: number } | undefined>;
  /** Rows (any tenant) that still name `digest`. */
  rowsWithDigest(digest: string): Promise<number>;
  /** Live agents (any tenant) created from `digest`: its files must stay while there are any. */
  agentsWithDigest(digest: string): Promise<number>;
}

/** `name[:tag]` → its parts (`latest` when no tag); a digest is not a name. */
export function parseImageRef(ref: string): { name: string; tag: string } {
  const at = ref.lastIndexOf(":");
  // A colon before the last slash is a registry port (`host:5000/x`), not a tag.
  if (at > ref.lastIndexOf("/")) return { name: ref.slice(0, at), tag: ref.slice(at + 1) };
  return { name: ref, tag: "latest" };
}

export function imageRecord(row: ImageRow): ImageRecord {
  return {
    id: row.id,
    tenantId: row.tenantId,
    name: row.name,
    tag: row.tag,
    digest: row.digest,
    sizeBytes: row.sizeBytes,
    config: row.config,
    createdAt: row.createdAt.toISOString(),
  };
}

export function createImageRepo(db: Db): ImageRepo {
  return {
    list(tenantId, opts) {
      const after = opts.after ? sql`(${images.name}, ${images.tag}) > (${opts.after.name}, ${opts.after.tag})` : undefined;
      return db
        .select()
        .from(images)
        .where(and(eq(images.tenantId, tenantId), after))
        .orderBy(asc(images.name), asc(images.tag))
        .limit(opts.limit);
    },
    async get(id) {
      return (await db.select().from(images).where(eq(images.id, id)).limit(1))[0];
    },
    async put(image) {
      const rows = await db
        .insert(images)
        .values(image)
        .onConflictDoUpdate({
          target: [images.tenantId, images.name, images.tag],
          set: { digest: image.digest, sizeBytes: image.sizeBytes, config: image.config, source: image.source, buildId: image.buildId, createdAt: new Date() },
        })
        .returning();
      return rows[0]!;
    },
    async remove(id) {
      await db.delete(images).where(eq(images.id, id));
    },
    async byDigest(digest) {
      return (await db.select({ config: images.config, sizeBytes: images.sizeBytes }).from(images).where(eq(images.digest, digest)).limit(1))[0];
    },
    async rowsWithDigest(digest) {
      return (await db.select({ n: count() }).from(images).where(eq(images.digest, digest)))[0]?.n ?? 0;
    },
    async agentsWithDigest(digest) {
      return (
        (
          await db
            .select({ n: count() })
            .from(agents)
            .where(and(eq(agents.imageDigest, digest), isNull(agents.deletedAt)))
        )[0]?.n ?? 0
      );
    },
    async resolve(tenantId, ref) {
      const where = isImageDigest(ref)
        ? and(eq(images.tenantId, tenantId), eq(images.digest, ref))
        : and(eq(images.tenantId, tenantId), eq(images.name, parseImageRef(ref).name), eq(images.tag, parseImageRef(ref).tag));
      const row = (await db.select().from(images).where(where).limit(1))[0];
      return row ? imageRecord(row) : undefined;
    },
  };
}
