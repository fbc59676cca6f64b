CREATE TABLE "audit_chain_heads" (
	"chain" text PRIMARY KEY NOT NULL,
	"seq" bigint NOT NULL,
	"hash" text NOT NULL
);
--> statement-breakpoint
DROP INDEX "rate_cards_tenant_idx";--> statement-breakpoint
ALTER TABLE "audit_log" ADD COLUMN "seq" bigint;--> statement-breakpoint
ALTER TABLE "audit_log" ADD COLUMN "prev_hash" text;--> statement-breakpoint
ALTER TABLE "audit_log" ADD COLUMN "hash" text;--> statement-breakpoint
ALTER TABLE "tenants" ADD COLUMN "status" text DEFAULT 'active' NOT NULL;--> statement-breakpoint
ALTER TABLE "tenants" ADD COLUMN "status_reason" text;--> statement-breakpoint
ALTER TABLE "tenants" ADD COLUMN "suspended_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "tenants" ADD COLUMN "deleted_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "invoice_lines" ADD COLUMN "rate_card_id" text;--> statement-breakpoint
ALTER TABLE "rate_cards" ADD COLUMN "effective_from" timestamp with time zone DEFAULT '1970-01-01T00:00:00Z' NOT NULL;--> statement-breakpoint
ALTER TABLE "rate_cards" ADD COLUMN "created_by" text;--> statement-breakpoint
CREATE UNIQUE INDEX "audit_chain_idx" ON "audit_log" USING btree (coalesce("tenant_id", ''),"seq");--> statement-breakpoint
CREATE UNIQUE INDEX "rate_cards_version_idx" ON "rate_cards" USING btree (coalesce("tenant_id", ''),"effective_from");