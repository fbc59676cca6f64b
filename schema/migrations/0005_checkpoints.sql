CREATE TABLE "checkpoints" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"agent_id" text NOT NULL,
	"host_id" text NOT NULL,
	"name" text,
	"origin" text NOT NULL,
	"bytes" bigint NOT NULL,
	"paused_ms" integer NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"deleted_at" timestamp with time zone,
	"request_id" text
);
--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "forked_from" text;--> statement-breakpoint
ALTER TABLE "checkpoints" ADD CONSTRAINT "checkpoints_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "checkpoints" ADD CONSTRAINT "checkpoints_agent_id_agents_id_fk" FOREIGN KEY ("agent_id") REFERENCES "public"."agents"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "checkpoints_agent_name_idx" ON "checkpoints" USING btree ("agent_id","name") WHERE deleted_at is null and name is not null;--> statement-breakpoint
CREATE INDEX "checkpoints_agent_page_idx" ON "checkpoints" USING btree ("agent_id","created_at","id") WHERE deleted_at is null;--> statement-breakpoint
CREATE INDEX "checkpoints_tenant_idx" ON "checkpoints" USING btree ("tenant_id","created_at");