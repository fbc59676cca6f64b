CREATE TABLE "agent_commits" (
	"agent_id" text PRIMARY KEY NOT NULL,
	"host_id" text NOT NULL,
	"generation" integer NOT NULL,
	"files" jsonb NOT NULL,
	"bytes" bigint NOT NULL,
	"snapshot_at" timestamp with time zone NOT NULL,
	"committed_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "agents" ADD COLUMN "generation" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "secret_hash" text;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "clock_skew_ms" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "used_mib" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "awake_agents" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "draining_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "agent_commits" ADD CONSTRAINT "agent_commits_agent_id_agents_id_fk" FOREIGN KEY ("agent_id") REFERENCES "public"."agents"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "agents_host_idx" ON "agents" USING btree ("host_id") WHERE deleted_at is null;