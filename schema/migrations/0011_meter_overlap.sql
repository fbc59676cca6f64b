ALTER TABLE "meter_segments" ADD COLUMN "billed_spans" "int8multirange";--> statement-breakpoint
ALTER TABLE "meter_segments" ADD COLUMN "overlap_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_usage" ADD COLUMN "overlap_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
CREATE INDEX "meter_segments_agent_started_idx" ON "meter_segments" USING btree ("agent_id","started_at");