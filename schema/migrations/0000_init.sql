CREATE TABLE "agents" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"name" text NOT NULL,
	"image" text NOT NULL,
	"vcpus" integer DEFAULT 1 NOT NULL,
	"mem_mib" integer DEFAULT 256 NOT NULL,
	"idle_timeout_ms" integer DEFAULT 60000 NOT NULL,
	"stream_idle_ms" integer DEFAULT 60000 NOT NULL,
	"public" boolean DEFAULT false NOT NULL,
	"allow_egress" boolean DEFAULT false NOT NULL,
	"non_waking" jsonb,
	"host_id" text,
	"state" text DEFAULT 'creating' NOT NULL,
	"last_wake_at" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"deleted_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "audit_log" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"tenant_id" text,
	"actor" text NOT NULL,
	"action" text NOT NULL,
	"target" text NOT NULL,
	"request_id" text,
	"detail" jsonb
);
--> statement-breakpoint
CREATE TABLE "hosts" (
	"id" text PRIMARY KEY NOT NULL,
	"url" text,
	"driver" text NOT NULL,
	"capacity_mib" integer NOT NULL,
	"last_heartbeat_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "runs" (
	"id" text PRIMARY KEY NOT NULL,
	"agent_id" text NOT NULL,
	"tenant_id" text NOT NULL,
	"host_id" text NOT NULL,
	"vm_id" text NOT NULL,
	"woke_at" timestamp with time zone NOT NULL,
	"wake_reason" text NOT NULL,
	"wake_mode" text NOT NULL,
	"timings" jsonb,
	"slept_at" timestamp with time zone,
	"sleep_reason" text
);
--> statement-breakpoint
CREATE TABLE "tenants" (
	"id" text PRIMARY KEY NOT NULL,
	"name" text NOT NULL,
	"time_zone" text DEFAULT 'UTC' NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "vm_events" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"host_id" text NOT NULL,
	"agent_id" text NOT NULL,
	"vm_id" text NOT NULL,
	"run_id" text,
	"from_state" text NOT NULL,
	"to_state" text NOT NULL,
	"reason" text NOT NULL,
	"timings" jsonb,
	"detail" jsonb
);
--> statement-breakpoint
CREATE TABLE "webhook_attempts" (
	"id" text PRIMARY KEY NOT NULL,
	"delivery_id" text NOT NULL,
	"attempt" integer NOT NULL,
	"worker" text NOT NULL,
	"request_id" text NOT NULL,
	"started_at" timestamp with time zone NOT NULL,
	"finished_at" timestamp with time zone,
	"duration_ms" integer,
	"outcome" text NOT NULL,
	"status_code" integer,
	"error" text
);
--> statement-breakpoint
CREATE TABLE "webhook_deliveries" (
	"id" text PRIMARY KEY NOT NULL,
	"endpoint_id" text NOT NULL,
	"agent_id" text NOT NULL,
	"tenant_id" text NOT NULL,
	"external_id" text NOT NULL,
	"headers" jsonb NOT NULL,
	"body" "bytea" NOT NULL,
	"body_bytes" integer NOT NULL,
	"received_at" timestamp with time zone NOT NULL,
	"request_id" text,
	"status" text DEFAULT 'pending' NOT NULL,
	"attempts" integer DEFAULT 0 NOT NULL,
	"round_attempts" integer DEFAULT 0 NOT NULL,
	"next_attempt_at" timestamp with time zone NOT NULL,
	"lease_id" text,
	"last_error" text,
	"delivered_at" timestamp with time zone,
	"dead_at" timestamp with time zone
);
--> statement-breakpoint
CREATE TABLE "webhook_endpoints" (
	"id" text PRIMARY KEY NOT NULL,
	"tenant_id" text NOT NULL,
	"agent_id" text NOT NULL,
	"name" text NOT NULL,
	"scheme" text NOT NULL,
	"path" text NOT NULL,
	"secret" text NOT NULL,
	"previous_secret" text,
	"previous_secret_expires_at" timestamp with time zone,
	"rate_tat" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"rotated_at" timestamp with time zone,
	"deleted_at" timestamp with time zone
);
--> statement-breakpoint
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
CREATE TABLE "agent_proxy_limits" (
	"agent_id" text PRIMARY KEY NOT NULL,
	"response_timeout_ms" integer,
	"proxy_idle_timeout_ms" integer,
	"max_body_bytes" bigint,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "agents" ADD CONSTRAINT "agents_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhook_attempts" ADD CONSTRAINT "webhook_attempts_delivery_id_webhook_deliveries_id_fk" FOREIGN KEY ("delivery_id") REFERENCES "public"."webhook_deliveries"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhook_deliveries" ADD CONSTRAINT "webhook_deliveries_endpoint_id_webhook_endpoints_id_fk" FOREIGN KEY ("endpoint_id") REFERENCES "public"."webhook_endpoints"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "webhook_endpoints" ADD CONSTRAINT "webhook_endpoints_agent_id_agents_id_fk" FOREIGN KEY ("agent_id") REFERENCES "public"."agents"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "invoice_lines" ADD CONSTRAINT "invoice_lines_invoice_id_invoices_id_fk" FOREIGN KEY ("invoice_id") REFERENCES "public"."invoices"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "agent_proxy_limits" ADD CONSTRAINT "agent_proxy_limits_agent_id_agents_id_fk" FOREIGN KEY ("agent_id") REFERENCES "public"."agents"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "agents_tenant_idx" ON "agents" USING btree ("tenant_id");--> statement-breakpoint
CREATE INDEX "audit_tenant_idx" ON "audit_log" USING btree ("tenant_id","id");--> statement-breakpoint
CREATE INDEX "runs_agent_idx" ON "runs" USING btree ("agent_id","woke_at");--> statement-breakpoint
CREATE INDEX "vm_events_agent_idx" ON "vm_events" USING btree ("agent_id","id");--> statement-breakpoint
CREATE UNIQUE INDEX "webhook_attempts_delivery_attempt_uq" ON "webhook_attempts" USING btree ("delivery_id","attempt");--> statement-breakpoint
CREATE UNIQUE INDEX "webhook_deliveries_endpoint_external_uq" ON "webhook_deliveries" USING btree ("endpoint_id","external_id");--> statement-breakpoint
CREATE INDEX "webhook_deliveries_due_idx" ON "webhook_deliveries" USING btree ("next_attempt_at") WHERE "webhook_deliveries"."status" in ('pending', 'in_flight');--> statement-breakpoint
CREATE INDEX "webhook_deliveries_endpoint_idx" ON "webhook_deliveries" USING btree ("endpoint_id","received_at");--> statement-breakpoint
CREATE UNIQUE INDEX "webhook_endpoints_agent_name_uq" ON "webhook_endpoints" USING btree ("agent_id","name") WHERE "webhook_endpoints"."deleted_at" is null;--> statement-breakpoint
CREATE UNIQUE INDEX "invoices_tenant_month_idx" ON "invoices" USING btree ("tenant_id","month");--> statement-breakpoint
CREATE INDEX "meter_conflicts_segment_idx" ON "meter_conflicts" USING btree ("segment_id");--> statement-breakpoint
CREATE INDEX "meter_segments_received_brin" ON "meter_segments" USING brin ("received_at");--> statement-breakpoint
CREATE INDEX "meter_segments_started_brin" ON "meter_segments" USING brin ("started_at");--> statement-breakpoint
CREATE UNIQUE INDEX "rate_cards_tenant_idx" ON "rate_cards" USING btree ("tenant_id");