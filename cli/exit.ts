// The command line's exit codes, one per kind of outcome a script can act on, and the error that carries one.

/** What `agentvm` exits with (listed in `agentvm --help`). */
export const exitCodes = {
  ok: 0,
  /** The API refused the call (4xx): the envelope's message is printed. */
  api: 1,
  /** The command line was wrong (commander's errors, a missing token or option). */
  usage: 2,
  /** The gateway could not be reached (refused, DNS, reset before an answer). */
  unreachable: 3,
  /** The gateway or what is behind it failed or is unavailable (5xx). */
  server: 4,
  /** A wait (a wake, a build) took longer than its --timeout. */
  timeout: 5,
} as const;

export type ExitCode = (typeof exitCodes)[keyof typeof exitCodes];

/** The epilog of `agentvm --help`. */
export const exitCodeHelp = `Exit codes:
  0  ok
  1  the API refused the call (4xx: the error's code, message and request id are printed), or the CLI itself failed
  2  usage error (unknown command or option, a missing argument or token)
  3  cannot reach the gateway
  4  server error or unavailable (5xx)
  5  a wait timed out (--timeout)
  (agentvm exec exits with the command's own status: 128+N for signal N, 124 when its --timeout killed it)`;

/** A failure the command line reports in one line on stderr and exits with. */
export class CliError extends Error {
  readonly exitCode: ExitCode;
  constructor(exitCode: ExitCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "CliError";
    this.exitCode = exitCode;
  }
}

/** A usage error: exit 2. */
export function usageError(message: string): CliError {
  return new CliError(exitCodes.usage, message);
}

/** The exit status of a command run in an agent (`agentvm exec`): the program exits with it, printing nothing more. */
export class CommandStatus extends Error {
  readonly status: number;
  constructor(status: number) {
    super(`the command exited with ${status}`);
    this.name = "CommandStatus";
    this.status = status;
  }
}
