// Agent images: one row per tenant's name:tag, pointing at a content-addressed image on the hosts' disks.
import { bigint, index, jsonb, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";
import { tenants } from "./core.ts";
import type { ImageConfig } from "../contracts/image.ts";

const tz = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });

export const images = pgTable(
  "images",
  {
    id: text("id").primaryKey(),
    tenantId: text("tenant_id")
      .notNull()
      .references(() => tenants.id),
    name: text("name").notNull(),
    tag: text("tag").notNull(),
    /** `sha256:<hex>` of the root filesystem image; several rows (tags, tenants) may share one. */
    digest: text("digest").notNull(),
    /** Bytes of the root filesystem image. */
    sizeBytes: bigint("size_bytes", { mode: "number" }).notNull(),
    config: jsonb("config").$type<ImageConfig>().notNull(),
    /** How it came in: `containerfile` or `archive`. */
    source: text("source").notNull(),
    /** The build that made it (its log is kept beside the image's files). */
    buildId: text("build_id").notNull(),
    createdAt: tz("created_at").notNull().defaultNow(),
  },
  (t) => [uniqueIndex("images_tenant_name_tag_idx").on(t.tenantId, t.name, t.tag), index("images_digest_idx").on(t.digest)],
);
