// `agentvm exec ID [options] -- cmd…`: runs a command in an agent (waking it), its output streamed to ours as it happens, exiting with its status.
import { randomBytes } from "node:crypto";
import { constants } from "node:os";
import { type Command, InvalidArgumentError, Option } from "commander";
import { contextOf } from "./context.ts";
import { CommandStatus, usageError } from "./exit.ts";
import { duration } from "./options.ts";
import { runOnTty, wantsTty } from "./exec-tty.ts";
import { withSdk } from "./sdk.ts";

/** The status a shell gives a command killed by a signal: 128 + its number (KILL → 137). */
export function signalStatus(signal: string): number {
  const n = /^\d+$/.test(signal) ? Number(signal) : constants.signals[`SIG${signal.replace(/^SIG/, "")}` as keyof typeof constants.signals];
  return 128 + (n ?? 0);
}

/** What coreutils' `timeout` exits with when it killed the command. */
export const timedOutStatus = 124;

/** `--env K=V`, repeatable. */
function envPair(raw: string, previous: Record<string, string> = {}): Record<string, string> {
  const eq = raw.indexOf("=");
  if (eq <= 0) throw new InvalidArgumentError("must be NAME=VALUE");
  return { ...previous, [raw.slice(0, eq)]: raw.slice(eq + 1) };
}

/** Standard input up to this size goes inline with the command (the API's JSON body is bounded: 1 MiB by default). */
export const inlineStdinMax = 512 * 1024;

/**
 * Our standard input (a pipe or a file; never a terminal): whole when it ends within `inlineStdinMax` bytes, else a
 * stream of all of it (what was read first, then the rest as it is read: never held whole).
 */
async function takeStdin(): Promise<{ inline: Buffer } | { stream: ReadableStream<Uint8Array> }> {
  const chunks: Buffer[] = [];
  let size = 0;
  const it = process.stdin[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  for (;;) {
    const { done, value } = await it.next();
    if (done) return { inline: Buffer.concat(chunks) };
    chunks.push(value);
    size += value.length;
    if (size > inlineStdinMax) {
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          for (const chunk of chunks) controller.enqueue(chunk);
        },
        async pull(controller) {
          const next = await it.next();
          if (next.done) controller.close();
          else controller.enqueue(next.value);
        },
      });
      return { stream };
    }
  }
}

/** Writes a chunk and waits while the stream is full: the agent's output is read no faster than we can print it. */
function write(out: NodeJS.WriteStream, bytes: Buffer): Promise<void> | undefined {
  if (out.write(bytes)) return undefined;
  return new Promise((resolve) => out.once("drain", () => resolve()));
}

export function execCommand(program: Command): void {
  program
    .command("exec")
    .description("run a command in an agent (waking it if it sleeps); its output as it happens, its exit status ours")
    .argument("<id>", "the agent's id (agt_…)")
    .argument("<cmd...>", "the command and its arguments, after -- (agentvm exec agt_x -- ls -la /)")
    .option("--cwd <dir>", "absolute working directory (default: the image's)")
    .option("-e, --env <NAME=VALUE>", "a variable over the image's environment (repeatable)", envPair)
    .option("-u, --user <user>", "run as name, uid or uid:gid (default: the image's user)")
    .option("--timeout <duration>", "kill it after this long (exit 124); default the server's, 60s", duration)
    .option("--shell", "run the words as one /bin/sh -c string (pipes, globs and $VARS in the agent)")
    .addOption(new Option("-n, --no-stdin", "send no standard input (default: ours when it is not a terminal)"))
    .option("-t, --tty", "run it on a terminal, interactively (default when our stdin and stdout are terminals)")
    .option("-T, --no-tty", "never a terminal: output and stdin as plain streams")
    .addHelpText(
      "after",
      "\nOutput goes to stdout and stderr as the command writes it. The exit status is the command's (128+N for signal N,\n124 for --timeout); agentvm's own failures keep their codes (agentvm --help).\nStandard input is sent with the command when it is a pipe or a file (a terminal is not read): up to 512 KiB inline,\nlarger as a temporary file in the agent's /tmp that the command reads through /bin/sh (removed after).\nOn a terminal (both ours are terminals, or -t) it runs on a pseudo-terminal in the agent like ssh -t: our terminal is\nraw while it runs (^C goes to the command), its size follows ours, TERM is ours; one output stream; no --timeout.\nOur terminal is restored however agentvm ends.",
    )
    .action(
      async (
        id: string,
        words: string[],
        o: { cwd?: string; env?: Record<string, string>; user?: string; timeout?: number; shell?: boolean; stdin: boolean; tty?: boolean },
        cmd: Command,
      ) => {
        const ctx = contextOf(cmd);
        if (wantsTty(o.tty, process.stdin.isTTY === true, process.stdout.isTTY === true)) {
          if (o.timeout !== undefined) throw usageError("--timeout does not apply on a terminal (-T runs without one)");
          const status = await runOnTty(ctx.config, id, words, {
            ...(o.cwd !== undefined ? { cwd: o.cwd } : {}),
            ...(o.env !== undefined ? { env: o.env } : {}),
            ...(o.user !== undefined ? { user: o.user } : {}),
            ...(o.shell ? { shell: true } : {}),
          });
          if (status !== 0) throw new CommandStatus(status);
          return;
        }
        const stdin = o.stdin && !process.stdin.isTTY ? await takeStdin() : undefined;
        const exit = await withSdk(ctx, async (client) => {
          const agent = client.agents.connect(id);
          let command: string | string[] = o.shell ? words.join(" ") : words;
          // A large stdin goes first as a file in the agent (streamed), and the command reads it through /bin/sh.
          let stdinFile: string | undefined;
          if (stdin && "stream" in stdin) {
            stdinFile = `/tmp/.agentvm-stdin-${randomBytes(8).toString("hex")}`;
            await agent.files.write(stdinFile, stdin.stream, { mode: o.user !== undefined ? 0o644 : 0o600 });
            command = o.shell ? `exec < ${stdinFile}\n${command as string}` : ["/bin/sh", "-c", 'exec "$@" < "$0"', stdinFile, ...words];
          }
          try {
            const events = agent.execStream(command, {
              encoding: "base64",
              ...(o.cwd !== undefined ? { cwd: o.cwd } : {}),
              ...(o.env !== undefined ? { env: o.env } : {}),
              ...(o.user !== undefined ? { user: o.user } : {}),
              ...(o.timeout !== undefined ? { timeoutMs: o.timeout } : {}),
              ...(stdin && "inline" in stdin ? { stdin: stdin.inline } : {}),
            });
            for await (const event of events) {
              if ("stdout" in event) await write(process.stdout, Buffer.from(event.stdout, "base64"));
              else if ("stderr" in event) await write(process.stderr, Buffer.from(event.stderr, "base64"));
              else if ("error" in event) process.stderr.write(`agentvm: ${event.error}\n`);
              else return event.exit;
            }
            return undefined;
          } finally {
            if (stdinFile) await agent.files.remove(stdinFile).catch(() => {});
          }
        });
        if (!exit) throw new CommandStatus(1);
        if (exit.timedOut) {
          process.stderr.write(`agentvm: ${words[0]} timed out after ${o.timeout ?? 60_000} ms and was killed\n`);
          throw new CommandStatus(timedOutStatus);
        }
        if (exit.signal) throw new CommandStatus(signalStatus(exit.signal));
        if (exit.exitCode) throw new CommandStatus(exit.exitCode);
      },
    );
}
