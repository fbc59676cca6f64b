// `agentvm checkpoints ls|create|rm` and `agentvm restore`: an agent's checkpoints, and rolling it back to one.
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import { shortTime } from "./agents.ts";
import type { Column } from "./table.ts";

type Checkpoint = components["schemas"]["Checkpoint"];

const columns: Column[] = [
  { header: "ID" },
  { header: "NAME", shrink: true },
  { header: "ORIGIN" },
  { header: "BYTES", align: "right" },
  { header: "PAUSED", align: "right" },
  { header: "CREATED" },
];

function row(c: Checkpoint): string[] {
  return [c.id, c.name ?? "", c.origin, String(c.bytes), `${c.pausedMs} ms`, shortTime(c.createdAt)];
}

export function checkpointsCommand(program: Command): void {
  const checkpoints = program.command("checkpoints").description("an agent's checkpoints: immutable copies of its memory and disk");

  checkpoints
    .command("ls")
    .description("list an agent's checkpoints, oldest first (every page)")
    .argument("<agent>", "the agent's id (agt_…)")
    .action(async (agent: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(await api.GET("/v1/agents/{id}/checkpoints", { params: { path: { id: agent }, query: { limit, ...(cursor ? { cursor } : {}) } } }));
        return { items: page.checkpoints, nextCursor: page.nextCursor };
      });
      if (ctx.json) return ctx.printJson({ checkpoints: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(columns, listed.items.map(row));
    });

  checkpoints
    .command("create")
    .description("take a checkpoint of an agent (an awake one pauses for it); prints its id")
    .argument("<agent>", "the agent's id (agt_…)")
    .option("--name <name>", "a name, unique among the agent's checkpoints (restore takes it instead of the id)")
    .action(async (agent: string, o: { name?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const c = ok(
        await ctx.api().POST("/v1/agents/{id}/checkpoints", { params: { path: { id: agent } }, body: o.name !== undefined ? { name: o.name } : {} }),
      );
      if (ctx.json) ctx.printJson(c);
      else ctx.print(`${c.id}${c.name ? ` (${c.name})` : ""}: ${c.bytes} bytes, paused ${c.pausedMs} ms`);
    });

  checkpoints
    .command("rm")
    .description("delete a checkpoint (agents forked from it keep their own files)")
    .argument("<agent>", "the agent's id (agt_…)")
    .argument("<checkpoint>", "the checkpoint's id (ckp_…)")
    .action(async (agent: string, checkpoint: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const gone = ok(await ctx.api().DELETE("/v1/agents/{id}/checkpoints/{checkpointId}", { params: { path: { id: agent, checkpointId: checkpoint } } }));
      if (ctx.json) ctx.printJson(gone);
      else ctx.print(`deleted ${gone.id}`);
    });

  program
    .command("restore")
    .description("roll an agent back to one of its checkpoints (stopped if awake; its next call wakes it there)")
    .argument("<agent>", "the agent's id (agt_…)")
    .argument("<checkpoint>", "a checkpoint id (ckp_…) or the name of one of the agent's")
    .action(async (agent: string, checkpoint: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const a = ok(await ctx.api().POST("/v1/agents/{id}/restore", { params: { path: { id: agent } }, body: { checkpoint } }));
      if (ctx.json) ctx.printJson(a);
      else ctx.print(`${a.id} ${a.state} on checkpoint ${checkpoint}`);
    });
}
