// `agentvm agents ls|create|show|rm|wake|hibernate|lease`: the agents API (create also forks from a checkpoint), with progress while a wake waits.
import { type Command, Option } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok, type Api } from "./client.ts";
import { contextOf, type Context } from "./context.ts";
import { formatDuration } from "./duration.ts";
import { duration, integer } from "./options.ts";
import { startProgress } from "./progress.ts";
import type { Column } from "./table.ts";

type Agent = components["schemas"]["Agent"];
type Wake = components["schemas"]["Wake"];

const vmStates = ["creating", "booting", "running", "dozing", "snapshotting", "hibernated", "restoring", "stopped", "failed", "destroyed"] as const;

/** How long a wake may take before the CLI gives up (exit 5): a cold boot of a big image under TCG takes tens of seconds. */
const defaultWakeTimeout = "5m";

/** `2026-03-01T12:00:03.123Z` → `2026-03-01 12:00:03Z`. */
export function shortTime(iso: string | null | undefined): string {
  return iso ? iso.replace("T", " ").replace(/\.\d+Z$/, "Z") : "";
}

const mem = (mib: number) => (mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`);

const agentColumns: Column[] = [
  { header: "ID" },
  { header: "NAME", shrink: true },
  { header: "IMAGE", shrink: true },
  { header: "STATE" },
  { header: "VCPUS", align: "right" },
  { header: "MEM", align: "right" },
  { header: "LEASES", align: "right" },
  { header: "LAST WAKE" },
];

function agentRow(a: Agent): string[] {
  return [a.id, a.name, a.image, a.state, String(a.vcpus), mem(a.memMiB), String(a.leases), shortTime(a.lastWakeAt)];
}

/** The timings of a wake, the big ones first: `boot 3300 ms, clockFix 12 ms`. */
export function wakeSummary(w: Wake, tookMs: number): string {
  const timings = Object.entries(w.timings).map(([k, v]) => (typeof v === "number" ? `${k.replace(/Ms$/, "")} ${Math.round(v)} ms` : `${k} ${v}`));
  return `${w.id} ${w.state} (wake ${w.wake}, run ${w.runId}) in ${formatDuration(tookMs)}${timings.length ? `: ${timings.join(", ")}` : ""}`;
}

/**
 * Wakes the agent with the time so far on stderr; prints the wake's mode and timings (or with --json, the API's answer).
 * `create --wait` prints only the new id on stdout (a script's `id=$(agentvm agents create --wait)`): its summary goes to stderr.
 */
async function wake(ctx: Context, api: Api, id: string, timeoutMs: number, opts: { printJson: boolean; summaryToStderr?: boolean }): Promise<Wake> {
  const progress = startProgress(`waking ${id}`);
  let w: Wake;
  let tookMs: number;
  try {
    w = ok(await api.POST("/v1/agents/{id}/wake", { params: { path: { id } }, signal: AbortSignal.timeout(timeoutMs) }));
    tookMs = progress.elapsedMs();
  } finally {
    progress.done();
  }
  if (!ctx.json) {
    if (opts.summaryToStderr) process.stderr.write(`${wakeSummary(w, tookMs)}\n`);
    else ctx.print(wakeSummary(w, tookMs));
  } else if (opts.printJson) ctx.printJson(w);
  return w;
}

function showAgent(ctx: Context, a: Agent): void {
  const rows: [string, string][] = [
    ["id", a.id],
    ["name", a.name],
    ["tenant", a.tenantId],
    ["image", a.imageDigest ? `${a.image} (${a.imageDigest})` : a.image],
    ["state", a.state],
    ["url", `${ctx.config.url}${a.path}`],
    ["vcpus", String(a.vcpus)],
    ["memory", mem(a.memMiB)],
    ["disk", mem(a.diskMiB)],
    ["idle timeout", formatDuration(a.idleTimeoutMs)],
    ["stream idle", formatDuration(a.streamIdleMs)],
    ["public", a.public ? "yes (no token needed)" : "no"],
    ["egress", a.allowEgress ? "allowed" : "none"],
    ["in flight", String(a.inFlight)],
    ["leases", String(a.leases)],
    ["last wake", shortTime(a.lastWakeAt) || "never"],
    ["created", shortTime(a.createdAt)],
    [
      "limits",
      `response ${formatDuration(a.limits.responseTimeoutMs)}, idle ${formatDuration(a.limits.proxyIdleTimeoutMs)}, body ${a.limits.maxBodyBytes} bytes`,
    ],
  ];
  if (a.forkedFrom) rows.push(["forked from", a.forkedFrom]);
  if (a.pool) rows.push(["pool", `${a.pool.id} (${a.pool.state.replace("_", " ")})`]);
  if (a.lastHibernateError) rows.push(["hibernate failed", `${a.lastHibernateError.message} (${a.lastHibernateError.attempts} attempts)`]);
  ctx.print(rows.map(([k, v]) => `${k.padEnd(16)} ${v}`).join("\n"));
}

const idArg = (cmd: Command) => cmd.argument("<id>", "the agent's id (agt_…)");

export function agentsCommand(program: Command): void {
  const agents = program.command("agents").description("create, list, wake and remove agents");

  agents
    .command("ls")
    .description("list your agents, oldest first (every page)")
    .addOption(new Option("--state <state>", "only agents the database last saw in this state").choices(vmStates))
    .option("--name-prefix <prefix>", "only agents whose name starts with this")
    .option("--image <image>", "only agents of this image (demo, name:tag or sha256:…)")
    .option("--limit <n>", "at most this many agents", integer(1, 1_000_000))
    .action(async (o: { state?: string; namePrefix?: string; image?: string; limit?: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const api = ctx.api();
      const filters = {
        ...(o.state ? { state: o.state as Agent["state"] } : {}),
        ...(o.namePrefix ? { namePrefix: o.namePrefix } : {}),
        ...(o.image ? { image: o.image } : {}),
      };
      const listed = await ctx.all(async (cursor, limit) => {
        const page = ok(await api.GET("/v1/agents", { params: { query: { ...filters, limit, ...(cursor ? { cursor } : {}) } } }));
        return { items: page.agents, nextCursor: page.nextCursor };
      }, o.limit);
      if (ctx.json) return ctx.printJson({ agents: listed.items, nextCursor: listed.nextCursor });
      ctx.printTable(agentColumns, listed.items.map(agentRow));
    });

  agents
    .command("create")
    .description("create an agent (it sleeps until its first call); prints its id")
    .option("--name <name>", "a name (default agent)")
    .option("--image <image>", "a built-in image (default demo), name[:tag] of a built image or sha256:<digest>")
    .option("--vcpus <n>", "vCPUs", integer(1, 16))
    .option("--mem <MiB>", "memory, MiB", integer(64, 65_536))
    .option("--disk <MiB>", "its persistent disk, MiB", integer(64, 1024 * 1024))
    .option("--idle-timeout <duration>", "idle time before it hibernates (30s, 5m, 1h)", duration)
    .option("--public", "anyone may call it, without a token")
    .option("--egress", "it may open connections out")
    .option(
      "--from-checkpoint <ckp>",
      "fork it from a checkpoint (ckp_…, or AGENT:NAME for an agent's checkpoint by name): its image, vcpus, memory and disk are the checkpoint's",
    )
    .option("--wait", "wake it now and wait until it runs (progress on stderr)")
    .option("--timeout <duration>", "with --wait: give up after this long (exit 5)", duration, duration(defaultWakeTimeout))
    .action(
      async (
        o: {
          name?: string;
          image?: string;
          vcpus?: number;
          mem?: number;
          disk?: number;
          idleTimeout?: number;
          public?: boolean;
          egress?: boolean;
          fromCheckpoint?: string;
          wait?: boolean;
          timeout: number;
        },
        cmd: Command,
      ) => {
        const ctx = contextOf(cmd);
        const api = ctx.api();
        const body: components["schemas"]["CreateAgent"] = {
          ...(o.name !== undefined ? { name: o.name } : {}),
          ...(o.image !== undefined ? { image: o.image } : {}),
          ...(o.vcpus !== undefined ? { vcpus: o.vcpus } : {}),
          ...(o.mem !== undefined ? { memMiB: o.mem } : {}),
          ...(o.disk !== undefined ? { diskMiB: o.disk } : {}),
          ...(o.idleTimeout !== undefined ? { idleTimeoutMs: o.idleTimeout } : {}),
          ...(o.public ? { public: true } : {}),
          ...(o.egress ? { allowEgress: true } : {}),
          ...(o.fromCheckpoint !== undefined ? { fromCheckpoint: o.fromCheckpoint } : {}),
        };
        let agent = ok(await api.POST("/v1/agents", { body }));
        if (o.wait) {
          if (!ctx.json) ctx.print(agent.id);
          await wake(ctx, api, agent.id, o.timeout, { printJson: false, summaryToStderr: true });
          agent = ok(await api.GET("/v1/agents/{id}", { params: { path: { id: agent.id } } }));
          if (ctx.json) ctx.printJson(agent);
          return;
        }
        if (ctx.json) ctx.printJson(agent);
        else ctx.print(agent.id);
      },
    );

  idArg(agents.command("show").description("an agent, with its live state")).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = contextOf(cmd);
    const agent = ok(await ctx.api().GET("/v1/agents/{id}", { params: { path: { id } } }));
    if (ctx.json) ctx.printJson(agent);
    else showAgent(ctx, agent);
  });

  idArg(agents.command("rm").description("delete an agent (its VM, snapshot and disk go)")).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = contextOf(cmd);
    const gone = ok(await ctx.api().DELETE("/v1/agents/{id}", { params: { path: { id } } }));
    if (ctx.json) ctx.printJson(gone);
    else ctx.print(`deleted ${gone.id}`);
  });

  idArg(agents.command("wake").description("wake an agent now and wait until it runs; prints the wake mode and timings"))
    .option("--timeout <duration>", "give up after this long (exit 5)", duration, duration(defaultWakeTimeout))
    .action(async (id: string, o: { timeout: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      await wake(ctx, ctx.api(), id, o.timeout, { printJson: true });
    });

  idArg(agents.command("hibernate").description("snapshot an agent now; it wakes on its next call")).action(async (id: string, _o: unknown, cmd: Command) => {
    const ctx = contextOf(cmd);
    const progress = ctx.json ? undefined : startProgress(`hibernating ${id}`);
    try {
      const s = ok(await ctx.api().POST("/v1/agents/{id}/hibernate", { params: { path: { id } } }));
      progress?.done();
      if (ctx.json) ctx.printJson(s);
      else ctx.print(`${s.id} ${s.state}`);
    } catch (err) {
      progress?.done();
      throw err;
    }
  });

  idArg(agents.command("lease").description("keep an agent awake for a while (wakes it)"))
    .requiredOption("--ttl <duration>", "how long (1s to 24h: 30s, 5m, 1h)", duration)
    .action(async (id: string, o: { ttl: number }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const lease = ok(await ctx.api().POST("/v1/agents/{id}/leases", { params: { path: { id } }, body: { ttlMs: o.ttl } }));
      if (ctx.json) ctx.printJson(lease);
      else ctx.print(`lease ${lease.leaseId} keeps ${lease.agentId} awake until ${shortTime(lease.expiresAt)}`);
    });
}
