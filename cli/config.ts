// Where the command line finds its gateway and token, parsed once: flags, then AGENTVM_URL/AGENTVM_TOKEN, then the config file.
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { usageError } from "./exit.ts";

/** What `npm start` listens on (compose/node-gateway.ts: BIND_ADDRESS 127.0.0.1, PORT 8080). */
export const defaultUrl = "http://127.0.0.1:8080";

/** The items a list asks for per page when neither --page-size nor AGENTVM_PAGE_SIZE says (the API's own default). */
export const defaultPageSize = 100;
const maxPageSize = 1000;

export interface CliConfig {
  /** The gateway's base URL, without a trailing slash. */
  url: string;
  /** Where the URL came from, for messages: `--url`, `AGENTVM_URL`, the config file, or the default. */
  urlFrom: string;
  token: string | undefined;
  /** Items per page of every list the CLI follows (1–1000). */
  pageSize: number;
  /** The config file read (and written by `agentvm login`). */
  file: string;
  /** Our terminal's type (TERM), given to a command run on a terminal in an agent (`agentvm exec -t`). */
  term: string | undefined;
}

/** The file the config lives in: `$XDG_CONFIG_HOME/agentvm/config.json`, by default `~/.config/agentvm/config.json`. */
export function configFile(env: NodeJS.ProcessEnv): string {
  const base = env.XDG_CONFIG_HOME || join(env.HOME || homedir(), ".config");
  return join(base, "agentvm", "config.json");
}

interface StoredConfig {
  url?: string;
  token?: string;
}

function readStored(file: string): StoredConfig {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return {};
    throw usageError(`cannot read ${file}: ${(err as Error).message}`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw usageError(`${file} is not JSON: expected {"url": "...", "token": "..."}`);
  }
  const o = (typeof value === "object" && value !== null ? value : {}) as Record<string, unknown>;
  const str = (key: string) => (typeof o[key] === "string" && o[key] !== "" ? (o[key] as string) : undefined);
  return { ...(str("url") ? { url: str("url") } : {}), ...(str("token") ? { token: str("token") } : {}) };
}

function normalizeUrl(raw: string, from: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw usageError(`${from}: "${raw}" is not a URL (like ${defaultUrl})`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw usageError(`${from}: the gateway's URL must be http or https`);
  return raw.replace(/\/+$/, "");
}

function parsePageSize(raw: string, from: string): number {
  const n = /^\d{1,4}$/.test(raw) ? Number(raw) : NaN;
  if (!(n >= 1 && n <= maxPageSize)) throw usageError(`${from} must be a number of items from 1 to ${maxPageSize}`);
  return n;
}

/** The configuration: each of url and token from the first of flag, environment, config file; then the defaults. */
export function resolveConfig(
  flags: { url?: string | undefined; token?: string | undefined; pageSize?: string | undefined },
  env: NodeJS.ProcessEnv,
): CliConfig {
  const file = configFile(env);
  const stored = readStored(file);
  const url = flags.url
    ? { value: flags.url, from: "--url" }
    : env.AGENTVM_URL
      ? { value: env.AGENTVM_URL, from: "AGENTVM_URL" }
      : stored.url
        ? { value: stored.url, from: file }
        : { value: defaultUrl, from: "the default" };
  const token = flags.token || env.AGENTVM_TOKEN || stored.token;
  const pageSize = flags.pageSize
    ? parsePageSize(flags.pageSize, "--page-size")
    : env.AGENTVM_PAGE_SIZE
      ? parsePageSize(env.AGENTVM_PAGE_SIZE, "AGENTVM_PAGE_SIZE")
      : defaultPageSize;
  return { url: normalizeUrl(url.value, url.from), urlFrom: url.from, token, pageSize, file, term: env.TERM || undefined };
}

/** Writes `{url, token}` for later commands, readable by its owner only (mode 0600, in a 0700 directory). */
export function writeConfig(file: string, stored: { url: string; token: string }): void {
  normalizeUrl(stored.url, "--url");
  mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  writeFileSync(file, `${JSON.stringify(stored, null, 2)}\n`, { mode: 0o600 });
  chmodSync(file, 0o600); // a file that existed keeps its mode through writeFileSync
}
