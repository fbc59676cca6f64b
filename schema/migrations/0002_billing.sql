CREATE TABLE "invoice_lines" (
	"invoice_id" text NOT NULL,
	"line_no" integer NOT NULL,
	"agent_id" text NOT NULL,
	"resource" text NOT NULL,
	"quantity" numeric(40, 0) NOT NULL,
	"unit" text NOT NULL,
	"unit_price_nanocents" bigint NOT NULL,
	"amount_cents" bigint NOT NULL,
	CONSTRAINT "invoice_lines_invoice_id_line_no_pk" PRIMARY KEY("invoice_id","line_no")
);
--> statement-breakpoint
CREATE TABLE "invoices" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"month" text NOT NULL,
	"time_zone" text NOT NULL,
	"period_start" timestamp with time zone NOT NULL,
	"period_end" timestamp with time zone NOT NULL,
	"status" text DEFAULT 'draft' NOT NULL,
	"cutoff_at" timestamp with time zone,
	"currency" text DEFAULT 'USD' NOT NULL,
	"total_cents" bigint,
	"rates" jsonb,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finalized_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "meter_conflicts" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"segment_id" text NOT NULL,
	"received_at" timestamp with time zone NOT NULL,
	"incoming" jsonb NOT NULL,
	"existing" jsonb
);
--> statement-breakpoint
CREATE TABLE "meter_segments" (
	"id" text COLLATE "C" PRIMARY KEY NOT NULL,
	"tenant_id" text COLLATE "C" NOT NULL,
	"agent_id" text COLLATE "C" NOT NULL,
	"run_id" text COLLATE "C" NOT NULL,
	"started_at" timestamp with time zone NOT NULL,
	"ended_at" timestamp with time zone NOT NULL,
	"vcpus" integer NOT NULL,
	"mem_mib" integer NOT NULL,
	"start_reason" text NOT NULL,
	"end_reason" text NOT NULL,
	"received_at" timestamp with time zone NOT NULL,
	CONSTRAINT "meter_segments_positive" CHECK ("meter_segments"."ended_at" > "meter_segments"."started_at")
);
--> statement-breakpoint
CREATE TABLE "rate_cards" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text,
	"currency" text DEFAULT 'USD' NOT NULL,
	"vcpu_second_nanocents" bigint NOT NULL,
	"gib_second_nanocents" bigint NOT NULL,
	"snapshot_gib_month_nanocents" bigint NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "run_usage" (
	"run_id" text COLLATE "C" PRIMARY KEY NOT NULL,
	"tenant_id" text COLLATE "C" NOT NULL,
	"agent_id" text COLLATE "C" NOT NULL,
	"active_ms" bigint NOT NULL,
	"vcpu_ms" bigint NOT NULL,
	"mib_ms" bigint NOT NULL,
	"segments" integer NOT NULL,
	"first_started_at" timestamp with time zone NOT NULL,
	"last_ended_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "usage_quarter_hours" (
	"tenant_id" text COLLATE "C" NOT NULL,
	"bucket_start" timestamp with time zone NOT NULL,
	"agent_id" text COLLATE "C" NOT NULL,
	"active_ms" bigint NOT NULL,
	"vcpu_ms" bigint NOT NULL,
	"mib_ms" bigint NOT NULL,
	CONSTRAINT "usage_quarter_hours_tenant_id_bucket_start_agent_id_pk" PRIMARY KEY("tenant_id","bucket_start","agent_id")
);
--> statement-breakpoint
ALTER TABLE "invoice_lines" ADD CONSTRAINT "invoice_lines_invoice_id_invoices_id_fk" FOREIGN KEY ("invoice_id") REFERENCES "public"."invoices"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "invoices_tenant_month_idx" ON "invoices" USING btree ("tenant_id","month");--> statement-breakpoint
CREATE INDEX "meter_conflicts_segment_idx" ON "meter_conflicts" USING btree ("segment_id");--> statement-breakpoint
CREATE INDEX "meter_segments_received_brin" ON "meter_segments" USING brin ("received_at");--> statement-breakpoint
CREATE INDEX "meter_segments_started_brin" ON "meter_segments" USING brin ("started_at");--> statement-breakpoint
CREATE UNIQUE INDEX "rate_cards_tenant_idx" ON "rate_cards" USING btree ("tenant_id");