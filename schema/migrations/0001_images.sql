CREATE TABLE "images" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"name" text NOT NULL,
	"tag" text NOT NULL,
	"digest" text NOT NULL,
	"size_bytes" bigint NOT NULL,
	"config" jsonb NOT NULL,
	"source" text NOT NULL,
	"build_id" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "image_digest" text;--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "disk_mib" integer DEFAULT 1024 NOT NULL;--> statement-breakpoint
ALTER TABLE "images" ADD CONSTRAINT "images_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "images_tenant_name_tag_idx" ON "images" USING btree ("tenant_id","name","tag");--> statement-breakpoint
CREATE INDEX "images_digest_idx" ON "images" USING btree ("digest");