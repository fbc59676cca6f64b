CREATE TABLE "meter_coverage" (
	"tenant_id" text COLLATE "C" NOT NULL,
	"agent_id" text COLLATE "C" NOT NULL,
	"start_ms" bigint NOT NULL,
	"end_ms" bigint NOT NULL,
	"host_ids" text[] NOT NULL,
	CONSTRAINT "meter_coverage_tenant_id_agent_id_start_ms_pk" PRIMARY KEY("tenant_id","agent_id","start_ms"),
	CONSTRAINT "meter_coverage_positive" CHECK ("meter_coverage"."end_ms" > "meter_coverage"."start_ms")
);
--> statement-breakpoint
ALTER TABLE "meter_segments" ADD COLUMN "billed_spans" "int8multirange";--> statement-breakpoint
ALTER TABLE "meter_segments" ADD COLUMN "overlap_ms" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "run_usage" ADD COLUMN "overlap_ms" bigint DEFAULT 0 NOT NULL;