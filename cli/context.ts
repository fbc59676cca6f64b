// What every command's action gets from the global options: the configuration (parsed once), the client, and output helpers.
import type { Command } from "commander";
import { apiClient, type Api } from "./client.ts";
import { resolveConfig, type CliConfig } from "./config.ts";
import { followPages, type Page } from "./paging.ts";
import { renderTable, terminalWidth, type Column } from "./table.ts";

/** The program's global options (main.ts declares them). */
export interface GlobalOptions {
  url?: string;
  token?: string;
  json?: boolean;
  pageSize?: string;
}

export interface Context {
  config: CliConfig;
  /** --json: print the API's JSON instead of tables and sentences. */
  json: boolean;
  /** The typed client, with the token (a usage error without one). */
  api(): Api;
  print(text: string): void;
  printJson(value: unknown): void;
  printTable(columns: readonly Column[], rows: readonly (readonly string[])[]): void;
  /** Every item of a paged list (up to `max`), --page-size items a page. */
  all<T>(page: (cursor: string | undefined, limit: number) => Promise<Page<T>>, max?: number): Promise<{ items: T[]; nextCursor: string | null }>;
}

let parsed: Context | undefined;

/** The context of this run, built on first use from the global options and the environment. */
export function contextOf(cmd: Command): Context {
  if (parsed) return parsed;
  const o = cmd.optsWithGlobals<GlobalOptions>();
  const config = resolveConfig({ url: o.url, token: o.token, pageSize: o.pageSize }, process.env);
  let api: Api | undefined;
  parsed = {
    config,
    json: o.json === true,
    api: () => (api ??= apiClient(config)),
    print: (text) => void process.stdout.write(text.endsWith("\n") ? text : `${text}\n`),
    printJson: (value) => void process.stdout.write(`${JSON.stringify(value, null, 2)}\n`),
    printTable: (columns, rows) => void process.stdout.write(`${renderTable(columns, rows, { width: terminalWidth() })}\n`),
    all: (page, max) => followPages(page, { pageSize: config.pageSize, max }),
  };
  return parsed;
}
