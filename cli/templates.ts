// `agentvm templates ls`: the warm templates new agents are cloned from, on every live host (operator).
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { shortTime } from "./agents.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import type { Column } from "./table.ts";

type Template = components["schemas"]["Template"];

const columns: Column[] = [
  { header: "HOST" },
  { header: "KEY" },
  { header: "IMAGE", shrink: true },
  { header: "STATE" },
  { header: "VCPUS", align: "right" },
  { header: "MEM MIB", align: "right" },
  { header: "EGRESS" },
  { header: "BOOT", align: "right" },
  { header: "BYTES", align: "right" },
  { header: "CREATED" },
  { header: "ERROR", shrink: true },
];

function row(t: Template): string[] {
  return [
    t.hostId,
    t.key,
    t.image,
    t.state,
    String(t.vcpus),
    String(t.memMiB),
    t.allowEgress ? "yes" : "no",
    t.bootMs === undefined ? "" : `${Math.round(t.bootMs)} ms`,
    t.bytes === undefined ? "" : String(t.bytes),
    shortTime(t.createdAt),
    t.error ?? "",
  ];
}

export function templatesCommand(program: Command): void {
  const templates = program.command("templates").description("warm templates: per kind of VM, the checkpoint new agents are cloned from (operator token)");

  templates
    .command("ls")
    .description("list every live host's templates, by host then key (operator)")
    .action(async (_o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const listed = ok(await ctx.api().GET("/v1/templates"));
      if (ctx.json) return ctx.printJson(listed);
      ctx.printTable(columns, listed.templates.map(row));
    });
}
