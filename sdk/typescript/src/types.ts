// The SDK's public shapes: the API's own schemas (generated from its OpenAPI document) and the options its methods take.
import type { components } from "./api-types.ts";

type Schemas = components["schemas"];

export type AgentInfo = Schemas["Agent"];
export type CreateAgentInput = Schemas["CreateAgent"];
export type Checkpoint = Schemas["Checkpoint"];
export type Wake = Schemas["Wake"];
export type AgentState = Schemas["AgentState"];
export type Lease = Schemas["Lease"];

/** What a command is: an argv (run as is) or a string (run under `/bin/sh -c`). */
export type Command = string | readonly string[];

/** How to run a command: where, as whom, with what input, for how long. */
export interface ExecOptions {
  /** Absolute working directory (default: the image's). */
  cwd?: string;
  /** Variables over the image's own environment. */
  env?: Record<string, string>;
  /** `name`, `uid` or `uid:gid` (default: the image's user). */
  user?: string;
  /** Its standard input (default: none, /dev/null). */
  stdin?: string | Uint8Array;
  /** Killed (its whole process group) after this long; the server's default is 60 s; 0 = none (background only). */
  timeoutMs?: number;
  /** How stdout and stderr come back: `utf8` (default) or `base64` (for bytes that are not text). */
  encoding?: "utf8" | "base64";
  /** Abandons the call (the HTTP request; the command ends with its connection). */
  signal?: AbortSignal;
}

/** A command on a terminal (`Agent.openTty`): the terminal's size (1–1000 each) and where and as whom it runs. */
export interface TtyOptions {
  rows: number;
  cols: number;
  cwd?: string;
  /** Variables over the image's own environment (TERM defaults to xterm-256color). */
  env?: Record<string, string>;
  /** `name`, `uid` or `uid:gid` (default: the image's user). */
  user?: string;
}

/** A finished command (`error`: why it could not start, exit code 127). `ok` is an exit code of 0. */
export type ExecResult = Schemas["ExecResult"] & { ok: boolean };

/** How a streamed command ended. */
export interface ExecExit {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  durationMs: number;
}

/** One event of `execStream`, as it happens: some output, `{error}` when the command could not start, then its exit last. */
export type ExecEvent = { stdout: string } | { stderr: string } | { error: string } | { exit: ExecExit };

/** A background process, as the API describes it. */
export type ProcessInfo = Schemas["Process"];

/** A page of a background process's output. */
export type ProcessOutput = Schemas["ProcessOutput"];

export type SignalName = "TERM" | "KILL" | "INT" | "HUP" | "QUIT" | "USR1" | "USR2";

/** One entry of a directory listing. */
export type FileEntry = Schemas["DirEntry"];
export type DirectoryListing = Schemas["DirListing"];
/** A file written. */
export type FileWritten = Schemas["FileWritten"];
/** A tar extracted. */
export type TarWritten = Schemas["TarWritten"];

/** How a file is written: mode (a number such as `0o644`, or octal digits), owner, parents made. */
export interface WriteOptions {
  mode?: number | string;
  uid?: number;
  gid?: number;
  /** Make the missing parent directories. */
  mkdirs?: boolean;
  signal?: AbortSignal;
}

/** What `write` takes: text (UTF-8), bytes, a Blob or a stream (sent as it is read, never held whole). */
export type FileData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

/** A warm pool, as the API describes it. */
export type PoolInfo = Schemas["Pool"];
export type CreatePoolInput = Schemas["CreatePool"];
/** New sizes for a pool: `size` (ready agents kept), `maxSize` (agents in all), either or both. */
export type ResizePoolInput = Schemas["ResizePool"];
/** What acquire answers: the agent handed out, its pool, and whether it was forked for the call. */
export type PoolAcquired = Schemas["PoolAcquired"];
/** What release answers: the agent, back in the pool, and how long its reset took. */
export type PoolReleased = Schemas["PoolReleased"];
/** The answer of a reset: the agent, back at its checkpoint, the checkpoint, and how long it took. */
export type ResetResult = Schemas["AgentReset"];
export type PoolDeleted = Schemas["PoolDeleted"];

/** One input action on a desktop agent's screen (`move`, `click`, `double_click`, `drag`, `scroll`, `type`, `key`, `wait`). */
export type DesktopAction = Schemas["DesktopAction"];
/** The cursor, the display and (unless asked not to) the screen after a batch, as base64 PNG. */
export type DesktopActionsResult = Schemas["DesktopActionsResult"];
export type DesktopViewers = Schemas["DesktopViewers"];
