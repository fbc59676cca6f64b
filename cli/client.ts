// The typed API client (openapi-fetch over the types generated from the gateway's OpenAPI document) and its failures as exit codes.
import createClient, { type Client } from "openapi-fetch";
import type { paths } from "../contracts/api/types.ts";
import type { CliConfig } from "./config.ts";
import { CliError, exitCodes, usageError } from "./exit.ts";

/** JSON answers are typed; a call for text, CSV or a stream says so with `parseAs`. */
export type Api = Client<paths, `${string}/json`>;

/** What every typed call answers: the parsed success, or the parsed error body, and the response. */
interface Answer<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

/** How to get a token when there is none. */
export const tokenHelp =
  "no token: pass --token, set AGENTVM_TOKEN, or run `agentvm login --url URL --token TOKEN` (npm start prints one; `agentvm token --tenant ten_demo` mints one with the dev key)";

/** A client of the configured gateway with its bearer token; a call that cannot reach the gateway throws exit 3. */
export function apiClient(config: CliConfig, opts: { needToken?: boolean } = {}): Api {
  if (opts.needToken !== false && !config.token) throw usageError(tokenHelp);
  return createClient<paths, `${string}/json`>({
    baseUrl: config.url,
    headers: config.token ? { authorization: `Bearer ${config.token}` } : {},
    fetch: reaching(config),
  });
}

/** fetch, with a gateway that does not answer and a wait that ran out told apart from everything else. */
function reaching(config: CliConfig): (request: Request) => Promise<Response> {
  return async (request) => {
    try {
      return await fetch(request);
    } catch (err) {
      throw fetchFailure(err, config);
    }
  };
}

/** A failed fetch as the CLI reports it: a timeout (exit 5), an abort (rethrown), or no gateway there (exit 3). */
export function fetchFailure(err: unknown, config: Pick<CliConfig, "url" | "urlFrom">): unknown {
  if (err instanceof CliError) return err;
  const name = (err as { name?: string } | null)?.name;
  if (name === "TimeoutError") return new CliError(exitCodes.timeout, "timed out waiting for the gateway (raise --timeout)", { cause: err });
  if (name === "AbortError") return err;
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  const why = cause?.code ?? cause?.message ?? (err as Error).message;
  return new CliError(exitCodes.unreachable, `cannot reach the gateway at ${config.url} (${why}; the URL is from ${config.urlFrom})`, { cause: err });
}

/** The error envelope's one line: `error <code>: <message> (request req_…)`; a body of another kind, shortened. */
export function failureMessage(status: number, body: unknown): string {
  const e = (body as { error?: { code?: unknown; message?: unknown; requestId?: unknown } } | null)?.error;
  if (e && typeof e.code === "string" && typeof e.message === "string") {
    return `error ${e.code}: ${e.message}${typeof e.requestId === "string" ? ` (request ${e.requestId})` : ""}`;
  }
  const text = typeof body === "string" ? body.trim() : body === undefined ? "" : JSON.stringify(body);
  return `error http_${status}: ${text.length > 300 ? `${text.slice(0, 300)}…` : text || "(empty body)"}`;
}

/** The failure of an answer: exit 1 for a refusal (4xx), exit 4 for the server's failure (5xx, or anything else not 2xx). */
export function failure(status: number, body: unknown): CliError {
  return new CliError(status >= 400 && status < 500 ? exitCodes.api : exitCodes.server, failureMessage(status, body));
}

/** The data of a successful answer; a failure thrown as its exit code. */
export function ok<T>(answer: Answer<T>): T {
  if (!answer.response.ok) throw failure(answer.response.status, answer.error);
  return answer.data as T;
}

/** A response that is not a success, read and thrown (for streams the typed client hands over unread). */
export async function throwUnlessOk(response: Response): Promise<void> {
  if (response.ok) return;
  const text = await response.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not the envelope: the text says what happened
  }
  throw failure(response.status, body);
}
