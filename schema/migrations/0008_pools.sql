CREATE TABLE "pools" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"name" text NOT NULL,
	"from_checkpoint" text NOT NULL,
	"size" integer NOT NULL,
	"max_size" integer NOT NULL,
	"state" text DEFAULT 'active' NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"deleted_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "pool_id" text;--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "pool_state" text;--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "pool_acquired_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "pools" ADD CONSTRAINT "pools_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "pools_tenant_name_idx" ON "pools" USING btree ("tenant_id","name") WHERE deleted_at is null;--> statement-breakpoint
CREATE INDEX "pools_tenant_idx" ON "pools" USING btree ("tenant_id","created_at","id") WHERE deleted_at is null;--> statement-breakpoint
CREATE INDEX "agents_pool_idx" ON "agents" USING btree ("pool_id","pool_state","created_at") WHERE deleted_at is null and pool_id is not null;