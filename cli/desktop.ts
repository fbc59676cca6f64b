// `agentvm desktop screenshot|act|viewers|open`: a desktop agent's screen from the command line (docs/desktop.md).
import { readFileSync, writeFileSync } from "node:fs";
import type { Command } from "commander";
import type { components } from "../contracts/api/types.ts";
import { ok, throwUnlessOk } from "./client.ts";
import { contextOf } from "./context.ts";
import { shortTime } from "./agents.ts";
import { usageError } from "./exit.ts";
import type { Column } from "./table.ts";

type Viewer = components["schemas"]["DesktopViewers"]["viewers"][number];

function scaleOf(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0.1 || n > 1) throw usageError(`--scale: a number from 0.1 to 1, got "${value}"`);
  return n;
}

/** The PNG's own size (its IHDR), for the sentence that says what was written. */
function pngSize(png: Uint8Array): string {
  if (png.byteLength < 24) return "?";
  const view = new DataView(png.buffer, png.byteOffset, png.byteLength);
  return `${view.getUint32(16)}x${view.getUint32(20)}`;
}

/** Writes the PNG to `out` (`-`: stdout) and says so on stderr, where it does not mix with the picture. */
function writePng(png: Uint8Array, out: string, wake: string | null): void {
  if (out === "-") return void process.stdout.write(png);
  writeFileSync(out, png);
  process.stderr.write(`wrote ${out} (${pngSize(png)}, ${png.byteLength} bytes${wake ? `, the call woke the agent: ${wake}` : ""})\n`);
}

export function desktopCommand(program: Command): void {
  const desktop = program.command("desktop").description("a desktop agent's screen: screenshots, actions, who is watching, the viewer");

  desktop
    .command("screenshot")
    .description("the agent's screen as a PNG (waking it: a hibernated desktop comes back as it was)")
    .argument("<agent>", "the agent's id (agt_…)")
    .option("-o, --out <file>", "where to write it (- for stdout)", "screenshot.png")
    .option("--scale <n>", "0.1 to 1 of the display's size (nearest pixel)")
    .action(async (agent: string, o: { out: string; scale?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const scale = scaleOf(o.scale);
      const { response } = await ctx.api().GET("/v1/agents/{id}/desktop/screenshot", {
        params: { path: { id: agent }, query: scale !== undefined ? { scale: String(scale) } : {} },
        parseAs: "stream",
      });
      await throwUnlessOk(response);
      writePng(new Uint8Array(await response.arrayBuffer()), o.out, response.headers.get("x-wake"));
    });

  desktop
    .command("act")
    .description("run a batch of actions (a JSON list, or {actions: […]}) and print the cursor; --out writes the screen after them")
    .argument("<agent>", "the agent's id (agt_…)")
    .argument("<actions>", 'the actions as JSON, e.g. \'[{"type":"click","x":10,"y":20},{"type":"type","text":"hi"}]\', or - to read them from stdin')
    .option("-o, --out <file>", "write the screenshot after the last action here (- for stdout); none without it")
    .option("--scale <n>", "the screenshot's scale, 0.1 to 1")
    .action(async (agent: string, actionsArg: string, o: { out?: string; scale?: string }, cmd: Command) => {
      const ctx = contextOf(cmd);
      const text = actionsArg === "-" ? readFileSync(0, "utf8") : actionsArg;
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        throw usageError("<actions>: not JSON (a list of actions, or {actions: […]})");
      }
      const actions = Array.isArray(parsed) ? parsed : (parsed as { actions?: unknown } | null)?.actions;
      if (!Array.isArray(actions)) throw usageError("<actions>: a list of actions, or {actions: […]}");
      const scale = scaleOf(o.scale);
      const body = { actions, screenshot: o.out !== undefined || ctx.json, ...(scale !== undefined ? { scale } : {}) };
      const done = ok(await ctx.api().POST("/v1/agents/{id}/desktop/actions", { params: { path: { id: agent } }, body: body as never }));
      if (ctx.json) return ctx.printJson(done);
      if (o.out !== undefined && done.screenshot) writePng(Buffer.from(done.screenshot, "base64"), o.out, null);
      if (o.out !== "-")
        ctx.print(`cursor ${done.cursor.x},${done.cursor.y} · ${actions.length} action${actions.length === 1 ? "" : "s"} in ${done.durationMs} ms`);
    });

  const columns: Column[] = [{ header: "SESSION" }, { header: "MODE" }, { header: "WHO", shrink: true }, { header: "SINCE" }];
  desktop
    .command("viewers")
    .description("who is watching the agent's desktop, and who holds control (through any gateway)")
    .argument("<agent>", "the agent's id (agt_…)")
    .action(async (agent: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const listed = ok(await ctx.api().GET("/v1/agents/{id}/desktop/viewers", { params: { path: { id: agent } } }));
      if (ctx.json) return ctx.printJson(listed);
      ctx.printTable(
        columns,
        listed.viewers.map((v: Viewer) => [v.id, v.mode, v.actor, shortTime(v.since)]),
      );
    });

  desktop
    .command("open")
    .description("print the viewer's link (a page of the gateway: watch, take over); it carries your token, so share it only as you would the token")
    .argument("<agent>", "the agent's id (agt_…)")
    .action((agent: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const { url, token } = ctx.config;
      if (!token) throw usageError("no token to put in the link: pass --token, set AGENTVM_TOKEN or run agentvm login");
      // In the fragment: a browser never sends it to a server, and the page takes it out of the address bar.
      ctx.print(`${url.replace(/\/$/, "")}/v1/agents/${encodeURIComponent(agent)}/desktop#token=${encodeURIComponent(token)}`);
    });
}
