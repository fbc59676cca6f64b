// Every command of docs/getting-started.md, run in the page's order as a newcomer runs it: `npm start` in the background, the rest in one bash session.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { freeLoopbackPort } from "../../lib/node-net.ts";
import { waitFor } from "../helpers/wait.ts";

const root = fileURLToPath(new URL("../..", import.meta.url));
const page = readFileSync(join(root, "docs", "getting-started.md"), "utf8");
/** The address and placeholder the page writes; the test puts its own port and the printed token in their place. */
const pageUrl = "http://127.0.0.1:8080";
const tokenPlaceholder = "<the token npm start printed>";

/** The commands of the page's ```sh blocks in order: one per line (a trailing `\` joins the next), blank and comment lines left out. */
function shCommands(markdown: string): string[] {
  const commands: string[] = [];
  for (const block of markdown.matchAll(/^```sh\n([\s\S]*?)^```$/gm)) {
    let pending = "";
    for (const line of block[1]!.split("\n")) {
      if (!pending && (line.trim() === "" || line.trim().startsWith("#"))) continue;
      if (line.endsWith("\\")) {
        pending += `${line.slice(0, -1)} `;
        continue;
      }
      commands.push((pending + line).trim());
      pending = "";
    }
  }
  return commands;
}

/** Runs `script` with bash in the checkout; resolves with its exit code and output, whatever they are. */
function bash(script: string, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) => {
    // --norc: with a socket on stdin (how Node wires a child's stdio) bash would otherwise read ~/.bashrc.
    execFile("bash", ["--noprofile", "--norc", "-c", script], { cwd: root, env, timeout: timeoutMs, maxBuffer: 16 << 20 }, (error, out, err) =>
      resolve({ code: error ? Number(error.code ?? 1) : 0, out, err }),
    );
  });
}

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

const scratch = mkdtempSync(join(tmpdir(), "agentvm-getting-started-"));
let server: ChildProcess | undefined;

afterAll(async () => {
  if (server?.pid && groupAlive(server.pid)) {
    process.kill(-server.pid, "SIGKILL");
    await waitFor(() => !groupAlive(server!.pid!), 10_000, "npm start's processes to end");
  }
  rmSync(scratch, { recursive: true, force: true });
});

describe("docs/getting-started.md", () => {
  it("every command on the page runs and succeeds, in order", async () => {
    const commands = shCommands(page);
    expect(commands[0]).toBe("npm install");
    const startAt = commands.indexOf("npm start");
    expect(startAt, "the page starts the system with npm start").toBeGreaterThan(0);
    const rest = commands.filter((_c, i) => i !== 0 && i !== startAt);
    expect(commands.slice(startAt + 1), "every command after npm install talks to the running system, so follows npm start").toEqual(rest);
    expect(rest.length).toBeGreaterThanOrEqual(5);
    expect(rest.join("\n"), "the page's commands use the address npm start listens on").toContain(pageUrl);

    // `npm install` is the one command not run here: this suite runs from the tree it installed, so it is checked as done.
    expect(
      existsSync(join(root, "node_modules", ".bin", "vitest")) && existsSync(join(root, "node_modules", "node", "bin", "node")),
      "npm install has been run",
    ).toBe(true);

    // `npm start` as the page says, in the background: a data directory and a port of its own, the process driver (no VM to boot).
    const port = await freeLoopbackPort();
    const dataDir = join(scratch, "data");
    const quiet = { npm_config_update_notifier: "false", npm_config_fund: "false" };
    server = spawn("bash", ["--noprofile", "--norc", "-c", commands[startAt]!], {
      cwd: root,
      detached: true, // its own process group: npm, the gateway and the agents' processes are ended together
      env: { ...process.env, ...quiet, DATA_DIR: dataDir, PORT: String(port), DRIVER: "process", LOG_LEVEL: "warn" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let banner = "";
    server.stdout!.on("data", (d: Buffer) => (banner += d.toString()));
    server.stderr!.on("data", (d: Buffer) => (banner += d.toString()));
    await waitFor(
      () => {
        if (server!.exitCode !== null) throw new Error(`npm start exited early: ${banner}`);
        return banner.includes("Stop with Ctrl-C");
      },
      90_000,
      "npm start's banner",
    );
    const base = `http://127.0.0.1:${port}`;
    expect(banner).toContain(`gateway     ${base}`);
    const token = /^\s+token\s+(\S+)$/m.exec(banner)?.[1];
    expect(token, banner).toBeTruthy();

    // The rest in one bash session (variables carry from one command to the next), each followed by a marker with its exit status.
    const steps = rest.map((c) => c.replaceAll(tokenPlaceholder, token!).replaceAll(pageUrl, base));
    for (const step of steps) expect(step, "a placeholder the test does not fill").not.toMatch(/<[a-z][^>]*>/);
    const script = steps.map((step, i) => `${step}\nprintf '\\n@@step %d %d@@\\n' ${i} $?`).join("\n");
    const home = join(scratch, "home");
    const env: NodeJS.ProcessEnv = { ...process.env, ...quiet, HOME: home };
    for (const name of ["AGENTVM_URL", "AGENTVM_TOKEN", "AGENTVM_PAGE_SIZE", "XDG_CONFIG_HOME"]) delete env[name];
    const run = await bash(`mkdir -p "$HOME"\n${script}`, env, 120_000);

    const outputs = run.out.split(/\n?@@step \d+ \d+@@\n/);
    const statuses = [...run.out.matchAll(/@@step (\d+) (\d+)@@/g)].map((m) => ({ step: Number(m[1]), status: Number(m[2]) }));
    const report = `stdout:\n${run.out}\nstderr:\n${run.err}`;
    expect(
      statuses.map((s) => s.step),
      `every command ran\n${report}`,
    ).toEqual(steps.map((_, i) => i));
    for (const { step, status } of statuses) expect(status, `\`${rest[step]}\` failed\n${report}`).toBe(0);
    expect(run.code, report).toBe(0);

    // What the page says each one shows.
    const output = (command: string) => outputs[rest.findIndex((c) => c.startsWith(command))] ?? "";
    expect(existsSync(join(home, ".config", "agentvm", "config.json")), "login kept the URL and token").toBe(true);
    expect(output("npx agentvm agents ls")).toMatch(/^agt_demo\s/m);
    expect(output("curl ").trim()).toBe('{"count":1}');
    expect(output("npx agentvm agents show")).toMatch(/^state\s+running$/m);
    expect(output("npx agentvm events")).toMatch(/\brunning\b/);
    expect(output("npx agentvm logs")).toMatch(/^demo agent listening on/m);

    // Ctrl-C ends it all: no process of its group is left.
    process.kill(-server.pid!, "SIGINT");
    await waitFor(() => !groupAlive(server!.pid!), 30_000, "npm start and its children to exit after Ctrl-C");
  }, 180_000);
});
