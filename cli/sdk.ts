// The SDK's client for the commands built on it (exec, cp), with the CLI's configuration, and its errors as the CLI's exit codes.
import { AgentVM, AgentVMError } from "../sdk/typescript/src/index.ts";
import { fetchFailure, failureMessage, tokenHelp } from "./client.ts";
import type { Context } from "./context.ts";
import { CliError, exitCodes, usageError } from "./exit.ts";

/** An SDK client of the configured gateway with its token (a usage error without one). */
export function sdkClient(ctx: Context): AgentVM {
  if (!ctx.config.token) throw usageError(tokenHelp);
  return new AgentVM({ baseUrl: ctx.config.url, token: ctx.config.token });
}

/** What an SDK call threw, as the CLI reports it: the envelope's line (4xx exit 1, else exit 4), no gateway exit 3. */
export function cliFailure(err: unknown, ctx: Context): unknown {
  if (!(err instanceof AgentVMError)) return err;
  if (err.code === "unreachable") return fetchFailure(err.cause, ctx.config);
  const line = failureMessage(err.status, { error: { code: err.code, message: err.message, ...(err.requestId ? { requestId: err.requestId } : {}) } });
  return new CliError(err.status >= 400 && err.status < 500 ? exitCodes.api : exitCodes.server, line);
}

/** Runs an action over the SDK with its failures as exit codes. */
export async function withSdk<T>(ctx: Context, action: (client: AgentVM) => Promise<T>): Promise<T> {
  try {
    return await action(sdkClient(ctx));
  } catch (err) {
    throw cliFailure(err, ctx);
  }
}
