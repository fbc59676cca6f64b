// The exec, processes and files API's schemas: the bodies and queries the routes validate and the answers they give.
import { z } from "../../lib/api.ts";
import { AgentParams } from "../agents/api-schemas.ts";
import { objectError } from "../proxy/policy.ts";
import { signalNumbers } from "../../contracts/exec-wire.ts";

/** Text the exec server takes: no NUL (its strings are NUL-terminated). */
const text = (max: number, what: string) =>
  z
    .string({ error: `must be ${what}` })
    .max(max, { error: `must be at most ${max} characters` })
    .refine((s) => !s.includes("\0"), { error: "must not hold a NUL character" });

/** An absolute path inside the agent's root, without `..` segments (the exec server refuses them too). */
export const AbsPath = text(4096, "an absolute path")
  .refine((p) => p.startsWith("/"), { error: "must be an absolute path (starting with /)" })
  .refine((p) => !p.split("/").includes(".."), { error: "must not hold a .. segment" })
  .openapi({ example: "/home/user/notes.txt" });

const intIn = (min: number, max: number) => {
  const message = `must be an integer from ${min} to ${max}`;
  return z.number({ error: message }).int({ error: message }).min(min, { error: message }).max(max, { error: message });
};

/** A query integer (text in the URL). */
const queryInt = (min: number, max: number) => {
  const message = `must be an integer from ${min} to ${max}`;
  return z
    .string({ error: message })
    .regex(/^\d{1,16}$/, { error: message })
    .transform(Number)
    .refine((n) => n >= min && n <= max, { error: message });
};

const queryBool = () => z.enum(["true", "false", "1", "0"], { error: "must be true or false" }).transform((v) => v === "true" || v === "1");

const day = 24 * 3600_000;
/** Foreground commands' default timeout, ms. */
export const defaultExecTimeoutMs = 60_000;
/** The most output one stream keeps in a JSON answer (the rest is read and dropped: `truncated`). */
export const maxOutputBytes = 1024 * 1024;

const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, { error: "environment variable names are letters, digits and _, not starting with a digit" });

export const ExecBody = z
  .strictObject(
    {
      cmd: z
        .union(
          [
            z
              .array(text(128 * 1024, "a string"))
              .min(1, { error: "must name a program" })
              .max(4096),
            text(128 * 1024, "a string").min(1),
          ],
          {
            error: "must be an argv array of strings, or a string run by /bin/sh -c",
          },
        )
        .openapi({ description: "The argv (the program is looked up in PATH), or a string run by `/bin/sh -c`", example: ["python3", "-c", "print(1)"] }),
      cwd: AbsPath.optional().openapi({ description: "Working directory (default: the image's)" }),
      env: z
        .record(EnvName, text(128 * 1024, "a string"), {
          error: "must be an object of strings whose names are letters, digits and _, not starting with a digit",
        })
        .refine((e) => Object.keys(e).length <= 1024, { error: "at most 1024 variables" })
        .optional()
        .openapi({ description: "Variables over the image's own environment" }),
      user: z
        .string()
        .regex(/^(?:[a-z_][a-z0-9_.-]{0,31}\$?|\d{1,10}(?::\d{1,10})?)$/, { error: "must be a user name, a uid or uid:gid" })
        .optional()
        .openapi({ description: "Run as this user (name, uid or uid:gid); default: the image's user" }),
      stdin: text(64 * 1024 * 1024, "a string")
        .optional()
        .openapi({ description: "The process's standard input (default: none, /dev/null)" }),
      stdinEncoding: z.enum(["utf8", "base64"]).default("utf8").openapi({ description: "How `stdin` is written" }),
      timeoutMs: intIn(0, 7 * day)
        .optional()
        .openapi({
          description: `The process group is killed (SIGKILL) after this, ms; default ${defaultExecTimeoutMs} in the foreground, none in the background; 0 = none`,
        }),
      background: z.boolean({ error: "must be true or false" }).default(false).openapi({ description: "Start it and answer its pid (see /processes)" }),
      encoding: z.enum(["utf8", "base64"]).default("utf8").openapi({ description: "How stdout and stderr are given in the answer" }),
    },
    { error: objectError("an object {cmd, cwd, env, user, stdin, stdinEncoding, timeoutMs, background, encoding}") },
  )
  .openapi("ExecRequest");

export const ExitSchema = z.object({
  exitCode: z.number().int().nullable().openapi({ description: "The exit status; null when a signal ended it" }),
  signal: z.string().nullable().openapi({ description: "The signal that ended it (`KILL`, `TERM`…), or null", example: "KILL" }),
  timedOut: z.boolean().openapi({ description: "Its timeout killed it (signal `KILL`)" }),
  durationMs: z.number(),
});

export const ExecResultSchema = ExitSchema.extend({
  stdout: z.string(),
  stderr: z.string(),
  truncated: z.boolean().openapi({ description: `A stream passed ${maxOutputBytes} bytes: the rest was dropped` }),
  encoding: z.enum(["utf8", "base64"]),
  error: z.string().nullable().openapi({ description: "Why the command could not be started (exit code 127), or null" }),
}).openapi("ExecResult");

export const ProcessSchema = z
  .object({
    pid: z.number().int(),
    cmd: z.array(z.string()),
    state: z.enum(["running", "exited"]),
    exitCode: z.number().int().nullable(),
    signal: z.string().nullable(),
    startedAt: z.string().nullable().openapi({ description: "ISO 8601" }),
    endedAt: z.string().nullable().openapi({ description: "ISO 8601; null while it runs" }),
    error: z.string().optional().openapi({ description: "At its start only: why it could not be started (it exits 127)" }),
  })
  .openapi("Process");

export const ProcessListSchema = z.object({ processes: z.array(ProcessSchema) }).openapi("ProcessList");

export const ProcessParams = AgentParams.extend({
  pid: z
    .string()
    .regex(/^\d{1,10}$/, { error: "must be a process id" })
    .openapi({ param: { name: "pid", in: "path" }, example: "42" }),
});

export const WaitBody = z
  .strictObject(
    { timeoutMs: intIn(0, 3600_000).default(30_000).openapi({ description: "Answer after this long if it still runs, ms" }) },
    {
      error: objectError("an object {timeoutMs}"),
    },
  )
  .openapi("ProcessWait");

export const StdinBody = z
  .strictObject(
    {
      data: text(64 * 1024 * 1024, "a string").default(""),
      encoding: z.enum(["utf8", "base64"]).default("utf8"),
      eof: z.boolean({ error: "must be true or false" }).default(false).openapi({ description: "Close its stdin after `data`" }),
    },
    { error: objectError("an object {data, encoding, eof}") },
  )
  .openapi("ProcessStdin");

const signalNames = Object.keys(signalNumbers) as [string, ...string[]];
export const SignalBody = z
  .strictObject(
    {
      signal: z
        .union([z.enum(signalNames), intIn(1, 64)], { error: `must be one of ${signalNames.join(", ")} or a number from 1 to 64` })
        .default("TERM")
        .openapi({ example: "TERM" }),
    },
    { error: objectError("an object {signal}") },
  )
  .openapi("ProcessSignal");

export const OutputQuery = z.strictObject({
  stream: z.enum(["stdout", "stderr"]).default("stdout"),
  offset: queryInt(0, Number.MAX_SAFE_INTEGER).default(0).openapi({ type: "integer", description: "Bytes of the stream already read (its `nextOffset`)" }),
  limit: queryInt(1, maxOutputBytes)
    .default(65_536)
    .openapi({ type: "integer", description: `Bytes at most (default 65536, at most ${maxOutputBytes})` }),
  encoding: z.enum(["utf8", "base64"]).default("utf8"),
});

export const OutputSchema = z
  .object({
    data: z.string(),
    encoding: z.enum(["utf8", "base64"]),
    offset: z.number().int(),
    nextOffset: z.number().int(),
    dropped: z.number().int().openapi({ description: "Bytes the process wrote past what the VM keeps per stream (16 MiB), never readable" }),
    eof: z.boolean().openapi({ description: "It exited and everything was read" }),
  })
  .openapi("ProcessOutput");

export const FilesQuery = z.strictObject({ path: AbsPath });

/** An octal file mode (`0644`, `755`, `1777`). */
const OctalMode = z.string().regex(/^0?[0-7]{3,4}$/, { error: "must be an octal mode such as 0644" });

export const PutFileQuery = z.strictObject({
  path: AbsPath,
  mode: OctalMode.optional().openapi({ description: "The file's mode (default 0644)" }),
  uid: queryInt(0, 2 ** 32 - 2)
    .optional()
    .openapi({ type: "integer", description: "Owner (default: the image's user)" }),
  gid: queryInt(0, 2 ** 32 - 2)
    .optional()
    .openapi({ type: "integer" }),
  mkdirs: queryBool().default(false).openapi({ type: "boolean", description: "Make missing parent directories" }),
});

export const DeleteFileQuery = z.strictObject({
  path: AbsPath,
  recursive: queryBool().default(false).openapi({ type: "boolean", description: "Delete a directory and what it holds" }),
});

export const DirEntrySchema = z
  .object({
    name: z.string(),
    type: z.enum(["file", "dir", "symlink", "other"]),
    size: z.number().int(),
    mode: z.string().openapi({ description: "Octal", example: "0644" }),
    uid: z.number().int(),
    gid: z.number().int(),
    modifiedAt: z.string().nullable().openapi({ description: "ISO 8601" }),
  })
  .openapi("DirEntry");

export const DirListingSchema = z.object({ path: z.string(), entries: z.array(DirEntrySchema) }).openapi("DirListing");

export const FileWrittenSchema = z
  .object({ path: z.string(), size: z.number().int(), mode: z.string(), uid: z.number().int(), gid: z.number().int() })
  .openapi("FileWritten");

export const TarWrittenSchema = z.object({ path: z.string(), entries: z.number().int() }).openapi("TarWritten");
