// `agentvm hosts ls|show|drain|undrain`: the operator's hosts API — each host's health, load and agents, and drains.
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { shortTime } from "./agents.ts";
import { ok } from "./client.ts";
import { contextOf, type Context } from "./context.ts";
import { integer } from "./options.ts";
import type { Column } from "./table.ts";

type Host = components["schemas"]["Host"];

const columns: Column[] = [
  { header: "ID" },
  { header: "HEALTH", shrink: true },
  { header: "LIVE" },
  { header: "SKEW", align: "right" },
  { header: "USED/CAP MIB", align: "right" },
  { header: "AWAKE", align: "right" },
  { header: "AGENTS", align: "right" },
  { header: "DRAINING" },
  { header: "LAST HEARTBEAT" },
];

/** A skew in seconds with its sign (+ ahead), tenths below ten. */
function skew(ms: number): string {
  const s = ms / 1000;
  const text = Math.abs(s) < 10 ? s.toFixed(1) : String(Math.round(s));
  return `${ms > 0 ? "+" : ""}${text} s`;
}

const health = (h: Host) => (h.healthy ? "healthy" : (h.why ?? "unhealthy"));

function row(h: Host): string[] {
  return [
    h.id,
    health(h),
    h.live ? "yes" : "no",
    skew(h.clockSkewMs),
    `${h.usedMiB}/${h.capacityMiB}`,
    String(h.awakeAgents),
    String(h.agents),
    h.draining ? `since ${shortTime(h.drainingAt)}` : "no",
    shortTime(h.lastHeartbeatAt),
  ];
}

function showHost(ctx: Context, h: Host): void {
  const rows: [string, string][] = [
    ["id", h.id],
    ["health", health(h)],
    ["live", h.live ? "yes" : "no"],
    ["heartbeat", `${shortTime(h.lastHeartbeatAt)} (${Math.round(h.heartbeatAgeMs / 1000)} s ago)`],
    ["clock skew", skew(h.clockSkewMs)],
    ["memory", `${h.usedMiB} of ${h.capacityMiB} MiB used`],
    ["awake", String(h.awakeAgents)],
    ["agents", String(h.agents)],
    ["draining", h.draining ? `since ${shortTime(h.drainingAt)}` : "no"],
    ["driver", h.driver],
    ["url", h.url ?? "(in-process)"],
    ["started", shortTime(h.startedAt)],
  ];
  ctx.print(rows.map(([k, v]) => `${k.padEnd(10)} ${v}`).join("\n"));
}

const idArg = (cmd: Command) => cmd.argument("<id>", "the host's id (HOST_ID)");

export function hostsCommand(program: Command): void {
  const hosts = program.command("hosts").description("hosts: their health, load and agents; drain one for maintenance (operator token)");

  hosts
    .command("ls")
    .description("list hosts by id with their health (every page; operator)")
    .option("--limit <n>", "at most this many hosts", integer(1, 1_000_000))
    .action(async (o: { limit?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(await api.GET("/v1/hosts", { params: { query: { limit, ...(cursor ? { cursor } : {}) } } }));
        return { items: page.hosts, nextCursor: page.nextCursor };
      }, o.limit);
      if (ctx.json) return ctx.printJson({ hosts: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(columns, listed.items.map(row));
    });

  idArg(hosts.command("show").description("a host: health, heartbeat, clock skew, memory, agents (operator)")).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const h = ok(await ctx.api().GET("/v1/hosts/{id}", { params: { path: { id } } }));
      if (ctx.json) ctx.printJson(h);
      else showHost(ctx, h);
    },
  );

  idArg(hosts.command("drain").description("drain a host: it takes no new agents, its agents hibernate and wake on other hosts (operator)")).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const h = ok(await ctx.api().POST("/v1/hosts/{id}/drain", { params: { path: { id } } }));
      if (ctx.json) ctx.printJson(h);
      else ctx.print(`${h.id} draining since ${shortTime(h.drainingAt)}; ${h.agents} agent(s) on it, ${h.awakeAgents} awake`);
    },
  );

  idArg(hosts.command("undrain").description("stop draining a host: it takes new agents again (operator)")).action(
    async (id: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const h = ok(await ctx.api().POST("/v1/hosts/{id}/undrain", { params: { path: { id } } }));
      if (ctx.json) ctx.printJson(h);
      else ctx.print(`${h.id} ${health(h)}`);
    },
  );
}
