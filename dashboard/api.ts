// The dashboard's calls to the gateway's API: the bearer token kept in sessionStorage, failures as the envelope's message, lists followed through `nextCursor`.

const tokenKey = "agentvm.token";
/** A list is followed at most this many pages (1000 items each): a dashboard does not page through millions. */
const maxPages = 50;

export function storedToken(): string | null {
  return sessionStorage.getItem(tokenKey);
}

export function storeToken(token: string): void {
  sessionStorage.setItem(tokenKey, token);
}

export function forgetToken(): void {
  sessionStorage.removeItem(tokenKey);
}

/** An answer of the API that is not a success: its status, and the code and message of the error envelope. */
export class ApiError extends Error {
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Told when the stored token is refused (expired, revoked): the app goes back to sign-in with the message. */
let onUnauthorized: (message: string) => void = () => {};
export function whenUnauthorized(fn: (message: string) => void): void {
  onUnauthorized = fn;
}

async function request(path: string, accept: string, token: string | null): Promise<Response> {
  const headers: Record<string, string> = { accept };
  if (token) headers.authorization = `Bearer ${token}`;
  const res = await fetch(path, { headers, cache: "no-store" });
  if (res.ok) return res;
  let code = "error";
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = (await res.json()) as { error?: { code?: string; message?: string } };
    if (body.error?.message) message = body.error.message;
    if (body.error?.code) code = body.error.code;
  } catch {
    // not the envelope: the status line says it
  }
  throw new ApiError(res.status, code, message);
}

async function authorized(path: string, accept: string): Promise<Response> {
  try {
    return await request(path, accept, storedToken());
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      forgetToken();
      onUnauthorized(err.message);
    }
    throw err;
  }
}

/** GET a JSON answer with the stored token. */
export async function getJson<T>(path: string): Promise<T> {
  return (await (await authorized(path, "application/json")).json()) as T;
}

/** GET a text answer (an agent's log) with the stored token. */
export async function getText(path: string): Promise<string> {
  return (await authorized(path, "text/plain")).text();
}

/** Checks a token before keeping it: answers the API's refusal, if any (a token without agents:admin may still read usage). */
export async function checkToken(token: string): Promise<ApiError | undefined> {
  try {
    await request("/v1/agents?limit=1", "application/json", token);
    return undefined;
  } catch (err) {
    if (err instanceof ApiError) return err.status === 403 ? undefined : err;
    return new ApiError(0, "network", err instanceof Error ? err.message : String(err));
  }
}

/** `path` with `params` added to its query (undefined ones left out). */
export function withQuery(path: string, params: Record<string, string | number | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined) q.set(k, String(v));
  const s = q.toString();
  return s === "" ? path : `${path}${path.includes("?") ? "&" : "?"}${s}`;
}

/** Every item of a list: pages followed through `nextCursor` while the API gives one. */
export async function getAll<T>(path: string, key: string): Promise<T[]> {
  const out: T[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < maxPages; page++) {
    const body = await getJson<Record<string, unknown>>(withQuery(path, { limit: 1000, cursor }));
    out.push(...((body[key] as T[] | undefined) ?? []));
    const next = body.nextCursor;
    if (typeof next !== "string" || next === "") break;
    cursor = next;
  }
  return out;
}
