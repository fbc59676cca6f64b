// `agentvm pools create|list|get|resize|delete|acquire|release` and `agentvm reset`: warm pools of forks, and rolling a fork back to its checkpoint.
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok } from "./client.ts";
import { contextOf } from "./context.ts";
import { shortTime } from "./agents.ts";
import { usageError } from "./exit.ts";
import type { Column } from "./table.ts";

type Pool = components["schemas"]["Pool"];

const columns: Column[] = [
  { header: "ID" },
  { header: "NAME", shrink: true },
  { header: "CHECKPOINT" },
  { header: "READY", align: "right" },
  { header: "IN USE", align: "right" },
  { header: "RESETTING", align: "right" },
  { header: "SIZE", align: "right" },
  { header: "MAX", align: "right" },
  { header: "CREATED" },
];

function row(p: Pool): string[] {
  return [p.id, p.name, p.fromCheckpoint, String(p.ready), String(p.inUse), String(p.resetting), String(p.size), String(p.maxSize), shortTime(p.createdAt)];
}

function count(name: string, value: string): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw usageError(`${name}: must be a whole number, got "${value}"`);
  return n;
}

export function poolsCommand(program: Command): void {
  const pools = program.command("pools").description("warm pools: forks of a checkpoint kept ready to hand out, reset when given back");

  pools
    .command("create")
    .description("create a pool from a checkpoint (or from an image, booted and checkpointed first); prints its id")
    .option("--from-checkpoint <ref>", "a checkpoint id (ckp_…) or AGENT:NAME (an agent's checkpoint by name)")
    .option("--image <image>", "instead: an image, booted and checkpointed for the pool")
    .requiredOption("--size <n>", "how many ready agents it keeps")
    .option("--max-size <n>", "how many agents it may hold in all (default: size)")
    .option("--name <name>", "a name, unique among your pools")
    .action(async (o: { fromCheckpoint?: string; image?: string; size: string; maxSize?: string; name?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      if ((o.fromCheckpoint === undefined) === (o.image === undefined)) throw usageError("give one of --from-checkpoint or --image");
      const body = {
        size: count("--size", o.size),
        ...(o.maxSize !== undefined ? { maxSize: count("--max-size", o.maxSize) } : {}),
        ...(o.name !== undefined ? { name: o.name } : {}),
        ...(o.fromCheckpoint !== undefined ? { fromCheckpoint: o.fromCheckpoint } : {}),
        ...(o.image !== undefined ? { image: o.image } : {}),
      };
      const p = ok(await ctx.api().POST("/v1/pools", { body }));
      if (ctx.json) ctx.printJson(p);
      else ctx.print(p.id);
    });

  pools
    .command("list")
    .alias("ls")
    .description("list your pools with their counts")
    .action(async (_o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const listed = ok(await ctx.api().GET("/v1/pools", {}));
      if (ctx.json) return ctx.printJson(listed);
      ctx.printTable(columns, listed.pools.map(row));
    });

  pools
    .command("get")
    .description("one pool: how many of its agents are ready, in use and being made ready")
    .argument("<pool>", "the pool's id (pol_…)")
    .action(async (pool: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const p = ok(await ctx.api().GET("/v1/pools/{id}", { params: { path: { id: pool } } }));
      if (ctx.json) return ctx.printJson(p);
      ctx.printTable(columns, [row(p)]);
    });

  pools
    .command("resize")
    .description("change how many ready agents a pool keeps (more: forked now; fewer: the surplus ready ones deleted) and how many it may hold")
    .argument("<pool>", "the pool's id (pol_…)")
    .option("--size <n>", "how many ready agents it keeps")
    .option("--max <n>", "how many agents it may hold in all")
    .action(async (pool: string, o: { size?: string; max?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      if (o.size === undefined && o.max === undefined) throw usageError("give --size, --max or both");
      const body = {
        ...(o.size !== undefined ? { size: count("--size", o.size) } : {}),
        ...(o.max !== undefined ? { maxSize: count("--max", o.max) } : {}),
      };
      const p = ok(await ctx.api().PATCH("/v1/pools/{id}", { params: { path: { id: pool } }, body }));
      if (ctx.json) return ctx.printJson(p);
      ctx.printTable(columns, [row(p)]);
    });

  pools
    .command("delete")
    .alias("rm")
    .description("delete a pool: its ready agents are deleted, handed-out ones stay with their holders")
    .argument("<pool>", "the pool's id (pol_…)")
    .action(async (pool: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const gone = ok(await ctx.api().DELETE("/v1/pools/{id}", { params: { path: { id: pool } } }));
      if (ctx.json) ctx.printJson(gone);
      else ctx.print(`deleted ${gone.id}: ${gone.removed} agents removed, ${gone.leftInUse} left in use`);
    });

  pools
    .command("acquire")
    .description("hand out one of the pool's agents (woken in the background); prints its id")
    .argument("<pool>", "the pool's id (pol_…)")
    .option("--wait <ms>", "with none ready at its maxSize: how long to wait for one being made ready (default 10000, at most 60000; 0: fail at once)")
    .action(async (pool: string, o: { wait?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const query = o.wait !== undefined ? { waitMs: count("--wait", o.wait) } : {};
      const got = ok(await ctx.api().POST("/v1/pools/{id}/acquire", { params: { path: { id: pool }, query } }));
      if (ctx.json) ctx.printJson(got);
      else ctx.print(got.agent.id);
    });

  pools
    .command("release")
    .description("give an agent back to its pool: reset to the pool's checkpoint, then ready")
    .argument("<pool>", "the pool's id (pol_…)")
    .argument("<agent>", "the agent's id (agt_…)")
    .action(async (pool: string, agent: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const r = ok(await ctx.api().POST("/v1/pools/{id}/release", { params: { path: { id: pool } }, body: { agentId: agent } }));
      if (ctx.json) ctx.printJson(r);
      else ctx.print(`${r.agent.id} ready in ${pool} (reset ${r.resetMs} ms)`);
    });

  program
    .command("reset")
    .description("roll a forked agent back to the checkpoint it was forked from (woken in the background)")
    .argument("<agent>", "the agent's id (agt_…)")
    .action(async (agent: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const r = ok(await ctx.api().POST("/v1/agents/{id}/reset", { params: { path: { id: agent } } }));
      if (ctx.json) ctx.printJson(r);
      else ctx.print(`${r.agent.id} reset to ${r.checkpointId} (${r.resetMs} ms)`);
    });
}
