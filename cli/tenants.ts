// `agentvm tenants ls|create|show|suspend|resume|rm|whoami`: the operator's tenants API, and what a token says of its caller.
import { type Command, Option } from "commander";
import { decodeJwt } from "jose";
import type { components } from "../contracts/api/types.ts";
import { shortTime } from "./agents.ts";
import { ok } from "./client.ts";
import { contextOf, type Context } from "./context.ts";
import { usageError } from "./exit.ts";
import { integer } from "./options.ts";
import type { Column } from "./table.ts";

type Tenant = components["schemas"]["Tenant"];

export interface TokenClaims {
  tenant: string | null;
  subject: string | null;
  scopes: string[];
  issuer: string | null;
  expiresAt: string | null;
}

/** What a token says of its caller, unverified (the gateway verifies it on every call; this only reads it). */
export function tokenClaims(token: string): TokenClaims {
  let claims: Record<string, unknown>;
  try {
    claims = decodeJwt(token);
  } catch {
    throw usageError("the token is not a JWT: its tenant cannot be read");
  }
  const text = (v: unknown) => (typeof v === "string" ? v : null);
  return {
    tenant: text(claims.tenant),
    subject: text(claims.sub),
    scopes: typeof claims.scope === "string" ? claims.scope.split(" ").filter(Boolean) : [],
    issuer: text(claims.iss),
    expiresAt: typeof claims.exp === "number" ? new Date(claims.exp * 1000).toISOString() : null,
  };
}

const tenantColumns: Column[] = [
  { header: "ID" },
  { header: "NAME", shrink: true },
  { header: "STATUS" },
  { header: "TIME ZONE" },
  { header: "CREATED" },
  { header: "REASON", shrink: true },
];

const tenantRow = (t: Tenant): string[] => [t.id, t.name, t.status, t.timeZone, shortTime(t.createdAt), t.statusReason ?? ""];

function showTenant(ctx: Context, t: Tenant): void {
  const rows: [string, string][] = [
    ["id", t.id],
    ["name", t.name],
    ["status", t.status],
    ["time zone", t.timeZone],
    ["created", shortTime(t.createdAt)],
  ];
  if (t.statusReason) rows.push(["reason", t.statusReason]);
  if (t.suspendedAt) rows.push(["suspended", shortTime(t.suspendedAt)]);
  if (t.deletedAt) rows.push(["deleted", shortTime(t.deletedAt)]);
  ctx.print(rows.map(([k, v]) => `${k.padEnd(10)} ${v}`).join("\n"));
}

/** The caller of the configured token, from its claims (no call). */
function whoami(ctx: Context): void {
  if (!ctx.config.token) throw usageError("no token: pass --token, set AGENTVM_TOKEN, or run `agentvm login`");
  const claims = tokenClaims(ctx.config.token);
  if (ctx.json) return ctx.printJson({ caller: claims });
  ctx.print(
    `tenant   ${claims.tenant ?? "(none in the token)"}\nsubject  ${claims.subject ?? ""}\nscopes   ${claims.scopes.join(" ")}\nissuer   ${claims.issuer ?? ""}\nexpires  ${claims.expiresAt ?? "never"}`,
  );
}

const statuses = ["active", "suspended", "deleted"] as const;
const idArg = (cmd: Command) => cmd.argument("<id>", "the tenant's id");

export function tenantsCommand(program: Command): void {
  const tenants = program
    .command("tenants")
    .description("tenants: list, create, suspend, resume and delete them (operator token); alone, as whoami (any token)")
    .action((_o: unknown, cmd: Command) => whoami(contextOf(cmd)));

  tenants
    .command("ls")
    .description("list tenants, oldest first (every page; operator)")
    .addOption(new Option("--status <status>", "only tenants in this status").choices(statuses))
    .option("--limit <n>", "at most this many tenants", integer(1, 1_000_000))
    .action(async (o: { status?: (typeof statuses)[number]; limit?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(
          await api.GET("/v1/tenants", { params: { query: { limit, ...(o.status ? { status: o.status } : {}), ...(cursor ? { cursor } : {}) } } }),
        );
        return { items: page.tenants, nextCursor: page.nextCursor };
      }, o.limit);
      if (ctx.json) return ctx.printJson({ tenants: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(tenantColumns, listed.items.map(tenantRow));
    });

  tenants
    .command("create")
    .description("create a tenant; prints its id (operator)")
    .requiredOption("--name <name>", "its name (1–200 characters)")
    .option("--id <id>", "its id, e.g. your identity provider's tenant claim (default: a new ten_… id)")
    .option("--time-zone <zone>", "IANA zone of its invoices and reports (default UTC)")
    .action(async (o: { name: string; id?: string; timeZone?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const body = { name: o.name, ...(o.id !== undefined ? { id: o.id } : {}), ...(o.timeZone !== undefined ? { timeZone: o.timeZone } : {}) };
      const t = ok(await ctx.api().POST("/v1/tenants", { body }));
      if (ctx.json) ctx.printJson(t);
      else ctx.print(t.id);
    });

  tenants
    .command("show")
    .description("a tenant (operator); without an id, what your token says of you (as whoami)")
    .argument("[id]", "the tenant's id")
    .action(async (id: string | undefined, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      if (id === undefined) return whoami(ctx);
      const t = ok(await ctx.api().GET("/v1/tenants/{id}", { params: { path: { id } } }));
      if (ctx.json) ctx.printJson(t);
      else showTenant(ctx, t);
    });

  idArg(
    tenants.command("suspend").description("suspend a tenant: its calls get 403 tenant_suspended, its awake agents hibernate, nothing is deleted (operator)"),
  )
    .option("--reason <text>", "said to its callers in the 403 (at most 500 characters)")
    .action(async (id: string, o: { reason?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const s = ok(await ctx.api().POST("/v1/tenants/{id}/suspend", { params: { path: { id } }, body: o.reason !== undefined ? { reason: o.reason } : {} }));
      if (ctx.json) return ctx.printJson(s);
      const failed = s.failed.map((f) => `\n  ${f.agentId} did not hibernate: ${f.error}`).join("");
      ctx.print(
        `${s.tenant.id} ${s.tenant.status}; hibernated ${s.hibernated.length} agent(s)${s.hibernated.length ? `: ${s.hibernated.join(" ")}` : ""}${failed}`,
      );
    });

  idArg(tenants.command("resume").description("resume a suspended tenant (operator)")).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = contextOf(cmd);
    const t = ok(await ctx.api().POST("/v1/tenants/{id}/resume", { params: { path: { id } } }));
    if (ctx.json) ctx.printJson(t);
    else ctx.print(`${t.id} ${t.status}`);
  });

  idArg(tenants.command("rm").description("delete a tenant: its agents are destroyed, its usage and invoices kept (operator)")).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const d = ok(await ctx.api().DELETE("/v1/tenants/{id}", { params: { path: { id } } }));
      if (ctx.json) ctx.printJson(d);
      else ctx.print(`${d.tenant.id} ${d.tenant.status}; destroyed ${d.destroyed.length} agent(s)${d.destroyed.length ? `: ${d.destroyed.join(" ")}` : ""}`);
    },
  );

  tenants
    .command("whoami")
    .description("the tenant, subject and scopes your token names (read from its claims, no call)")
    .action((_o: unknown, cmd: Command) => whoami(contextOf(cmd)));
}
