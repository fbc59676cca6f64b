// `agentvm cp SRC DST`: copies a file or a tree between here and an agent (one side `ID:/path`; `-` is stdin or stdout), a tree as tar.
import { spawn } from "node:child_process";
import { createReadStream, createWriteStream, chmodSync, mkdirSync, statSync } from "node:fs";
import { basename, join, posix } from "node:path";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import type { Command } from "commander";
import type { Agent } from "../sdk/typescript/src/index.ts";
import { contextOf } from "./context.ts";
import { CliError, exitCodes, usageError } from "./exit.ts";
import { withSdk } from "./sdk.ts";

/** One side of a copy: a local path (or `-`), or a path in an agent. */
export type Side = { agent: string; path: string } | { local: string };

/** `agt_x:/etc/hosts` is in an agent (its path absolute); anything else is here. */
export function parseSide(raw: string): Side {
  const m = /^([A-Za-z][\w-]*):(.*)$/.exec(raw);
  if (!m) return { local: raw };
  const path = m[2]!;
  if (!path.startsWith("/")) throw usageError(`${raw}: the path in an agent must be absolute (${m[1]}:/path)`);
  return { agent: m[1]!, path };
}

const isDir = (p: string) => {
  try {
    return statSync(p).isDirectory();
  } catch {
    return false;
  }
};

/** Whether a path in the agent is a directory (a listing answers), without reading a file's bytes. */
async function remoteIsDir(agent: Agent, path: string): Promise<boolean> {
  try {
    await agent.files.list(path);
    return true;
  } catch {
    return false;
  }
}

/** Runs `tar` here with its stdin or stdout as a web stream; its failure is the copy's. */
function tar(args: string[], io: "read" | "write"): { stream: ReadableStream<Uint8Array> | WritableStream<Uint8Array>; done: Promise<void> } {
  const child = spawn("tar", args, { stdio: io === "read" ? ["ignore", "pipe", "pipe"] : ["pipe", "ignore", "pipe"] });
  let err = "";
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const done = new Promise<void>((resolve, reject) => {
    child.on("error", (e) => reject(new CliError(exitCodes.api, `tar: ${e.message}`)));
    child.on("close", (code) =>
      code === 0 ? resolve() : reject(new CliError(exitCodes.api, `tar ${args.join(" ")} failed: ${err.trim() || `exit ${code}`}`)),
    );
  });
  const stream = io === "read" ? (Readable.toWeb(child.stdout!) as ReadableStream<Uint8Array>) : (Writable.toWeb(child.stdin!) as WritableStream<Uint8Array>);
  return { stream, done };
}

/** Here → the agent: a file streamed (its mode kept), a directory as tar, `-` our stdin. */
async function upload(agent: Agent, local: string, path: string, print: (s: string) => void): Promise<void> {
  if (local === "-") {
    const r = await agent.files.write(path, Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>, { mkdirs: true });
    return print(`${r.path}: ${r.size} bytes`);
  }
  const st = statSync(local);
  const into = path.endsWith("/") || (await remoteIsDir(agent, path));
  if (st.isDirectory()) {
    // Into an existing directory the tree keeps its name; else it becomes `path`.
    const args = into ? ["-C", join(local, ".."), "-cf", "-", basename(local)] : ["-C", local, "-cf", "-", "."];
    const t = tar(args, "read");
    const [r] = await Promise.all([agent.files.uploadTar(path, t.stream as ReadableStream<Uint8Array>), t.done]);
    return print(`${r.path}: ${r.entries} entries`);
  }
  const dest = into ? posix.join(path, basename(local)) : path;
  const r = await agent.files.write(dest, Readable.toWeb(createReadStream(local)) as ReadableStream<Uint8Array>, { mode: st.mode & 0o7777, mkdirs: true });
  print(`${r.path}: ${r.size} bytes`);
}

/** The agent → here: a file streamed (its mode kept), a directory as tar extracted, `-` our stdout. */
async function download(agent: Agent, path: string, local: string, print: (s: string) => void): Promise<void> {
  if (await remoteIsDir(agent, path)) {
    if (local === "-") {
      await pipeline(Readable.fromWeb((await agent.files.downloadTar(path)) as NodeReadableStream), process.stdout);
      return;
    }
    // The tar's entries are named from the path's last component: into an existing directory the tree keeps that
    // name; else it becomes `local` (the first component stripped).
    const into = isDir(local);
    if (!into) mkdirSync(local, { recursive: true });
    const t = tar(["-C", local, "-xf", "-", "--no-same-owner", ...(into ? [] : ["--strip-components=1"])], "write");
    await Promise.all([(await agent.files.downloadTar(path)).pipeTo(t.stream as WritableStream<Uint8Array>), t.done]);
    return print(into ? join(local, posix.basename(path)) : local);
  }
  const response = await agent.files.stream(path);
  const body = Readable.fromWeb(response.body! as NodeReadableStream);
  if (local === "-") return pipeline(body, process.stdout, { end: false });
  const target = isDir(local) ? join(local, posix.basename(path)) : local;
  await pipeline(body, createWriteStream(target));
  const mode = response.headers.get("x-file-mode");
  if (mode && /^[0-7]+$/.test(mode)) chmodSync(target, Number.parseInt(mode, 8) & 0o777);
  print(`${target}: ${statSync(target).size} bytes`);
}

export function cpCommand(program: Command): void {
  program
    .command("cp")
    .description("copy a file or a directory between here and an agent: agentvm cp ./data agt_x:/work, agentvm cp agt_x:/out.json -")
    .argument("<src>", "a local path, - (stdin) or ID:/path")
    .argument("<dst>", "a local path, - (stdout) or ID:/path")
    .addHelpText(
      "after",
      "\nExactly one side is in an agent (ID:/absolute/path). A directory goes as tar (the local tar program): into an existing\ndirectory it keeps its name, else it becomes the destination. A file keeps its mode; missing parents are made in the agent.",
    )
    .action(async (src: string, dst: string, _o: unknown, cmd: Command) => {
      const ctx = contextOf(cmd);
      const from = parseSide(src);
      const to = parseSide(dst);
      const print = (s: string) => (ctx.json ? undefined : process.stderr.write(`${s}\n`));
      if ("agent" in from === "agent" in to) throw usageError("exactly one of SRC and DST must be in an agent (ID:/path)");
      await withSdk(ctx, async (client) => {
        if ("agent" in to && "local" in from) return upload(client.agents.connect(to.agent), from.local, to.path, print);
        if ("agent" in from && "local" in to) return download(client.agents.connect(from.agent), from.path, to.local, print);
      });
    });
}
