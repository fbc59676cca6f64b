CREATE TABLE "operations" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"agent_id" text NOT NULL,
	"run_id" text,
	"host_id" text NOT NULL,
	"upstream" text NOT NULL,
	"method" text NOT NULL,
	"path" text NOT NULL,
	"request_hash" text NOT NULL,
	"idempotency_key" text,
	"request_headers" jsonb,
	"mode" text NOT NULL,
	"state" text NOT NULL,
	"status" integer,
	"error" jsonb,
	"sent_at" timestamp with time zone,
	"first_byte_at" timestamp with time zone,
	"ended_at" timestamp with time zone,
	"request_bytes" bigint DEFAULT 0 NOT NULL,
	"response_bytes" bigint DEFAULT 0 NOT NULL,
	"response_headers" jsonb,
	"request_body" text,
	"response_body" text,
	"model" text,
	"input_tokens" integer,
	"output_tokens" integer,
	"attempts" integer DEFAULT 0 NOT NULL,
	"deadline_at" timestamp with time zone,
	"claimed_by" text,
	"claim_expires_at" timestamp with time zone,
	"delivered_at" timestamp with time zone,
	"delivery_id" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "upstreams" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"name" text NOT NULL,
	"base_url" text NOT NULL,
	"header_names" jsonb NOT NULL,
	"headers_sealed" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"deleted_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "meter_segments" ADD COLUMN "state" text DEFAULT 'active' NOT NULL;--> statement-breakpoint
ALTER TABLE "rate_cards" ADD COLUMN "doze_vcpu_second_nanocents" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "rate_cards" ADD COLUMN "doze_gib_second_nanocents" bigint;--> statement-breakpoint
ALTER TABLE "run_usage" ADD COLUMN "dozed_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_usage" ADD COLUMN "dozed_vcpu_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_usage" ADD COLUMN "dozed_mib_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "usage_quarter_hours" ADD COLUMN "dozed_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "usage_quarter_hours" ADD COLUMN "dozed_vcpu_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "usage_quarter_hours" ADD COLUMN "dozed_mib_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE INDEX "operations_agent_idx" ON "operations" USING btree ("agent_id","created_at");--> statement-breakpoint
CREATE INDEX "operations_run_idx" ON "operations" USING btree ("run_id") WHERE "operations"."run_id" is not null;--> statement-breakpoint
CREATE UNIQUE INDEX "operations_agent_idempotency_uq" ON "operations" USING btree ("agent_id","idempotency_key") WHERE "operations"."idempotency_key" is not null;--> statement-breakpoint
CREATE INDEX "operations_async_due_idx" ON "operations" USING btree ("claim_expires_at") WHERE "operations"."mode" = 'async' and "operations"."state" in ('queued', 'in_flight');--> statement-breakpoint
CREATE UNIQUE INDEX "upstreams_tenant_name_uq" ON "upstreams" USING btree ("tenant_id","name") WHERE "upstreams"."deleted_at" is null;--> statement-breakpoint
CREATE INDEX "vm_events_agent_at_idx" ON "vm_events" USING btree ("agent_id","at");