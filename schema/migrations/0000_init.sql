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
ALTER TABLE "agents" ADD CONSTRAINT "agents_tenant_id_tenants_id_fk" FOREIGN KEY ("tenant_id") REFERENCES "public"."tenants"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "agents_tenant_idx" ON "agents" USING btree ("tenant_id");--> statement-breakpoint
CREATE INDEX "audit_tenant_idx" ON "audit_log" USING btree ("tenant_id","id");--> statement-breakpoint
CREATE INDEX "runs_agent_idx" ON "runs" USING btree ("agent_id","woke_at");--> statement-breakpoint
CREATE INDEX "vm_events_agent_idx" ON "vm_events" USING btree ("agent_id","id");