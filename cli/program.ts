// The `agentvm` program: its global options, its command groups (one file each beside this one) and its exit codes.
import { readFileSync } from "node:fs";
import { Command, CommanderError, Option } from "commander";
import { agentsCommand } from "./agents.ts";
import { checkpointsCommand } from "./checkpoints.ts";
import { defaultPageSize, defaultUrl } from "./config.ts";
import { cpCommand } from "./cp.ts";
import { execCommand } from "./exec.ts";
import { CliError, CommandStatus, exitCodeHelp, exitCodes } from "./exit.ts";
import { hostsCommand } from "./hosts.ts";
import { imagesCommand } from "./images.ts";
import { invoicesCommand } from "./invoices.ts";
import { loginCommand } from "./login.ts";
import { eventsCommand, logsCommand } from "./logs.ts";
import { poolsCommand } from "./pools.ts";
import { desktopCommand } from "./desktop.ts";
import { ratesCommand } from "./rates.ts";
import { templatesCommand } from "./templates.ts";
import { tenantsCommand } from "./tenants.ts";
import { tokenCommand } from "./token.ts";
import { usageCommand } from "./usage.ts";

const version = (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version;

const configHelp = `Configuration (the first that says wins):
  --url, --token         flags
  AGENTVM_URL, AGENTVM_TOKEN
  the config file        written by \`agentvm login\` ($XDG_CONFIG_HOME or ~/.config, then agentvm/config.json)
  default URL            ${defaultUrl} (what npm start listens on)
  AGENTVM_PAGE_SIZE      items a list asks per page (default ${defaultPageSize}); lists follow every page`;

export function buildProgram(): Command {
  const program = new Command("agentvm")
    .description("Agents in microVMs that sleep between calls: create, wake, watch and bill them through a gateway.")
    .version(version)
    .addOption(new Option("--url <url>", "the gateway's base URL"))
    .addOption(new Option("--token <token>", "bearer token"))
    .addOption(new Option("--json", "print the API's JSON (lists: every page followed)"))
    .addOption(new Option("--page-size <n>", "items asked for per page of a list (1–1000)"))
    .exitOverride()
    .showHelpAfterError("(agentvm --help for usage)")
    .configureHelp({ showGlobalOptions: true, sortSubcommands: false })
    .addHelpText("after", `\n${configHelp}\n\n${exitCodeHelp}`);
  loginCommand(program);
  agentsCommand(program);
  execCommand(program);
  cpCommand(program);
  checkpointsCommand(program);
  poolsCommand(program);
  desktopCommand(program);
  logsCommand(program);
  eventsCommand(program);
  imagesCommand(program);
  usageCommand(program);
  invoicesCommand(program);
  ratesCommand(program);
  tenantsCommand(program);
  templatesCommand(program);
  hostsCommand(program);
  tokenCommand(program);
  return program;
}

/** Runs one command line; answers the exit code (the failure printed on stderr in one line). */
export async function run(argv: readonly string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv, { from: "user" });
    return exitCodes.ok;
  } catch (err) {
    if (err instanceof CommanderError) return err.exitCode === 0 ? exitCodes.ok : exitCodes.usage; // commander printed it
    if (err instanceof CommandStatus) return err.status;
    if (err instanceof CliError) {
      process.stderr.write(`${err.message}\n`);
      return err.exitCode;
    }
    process.stderr.write(`agentvm: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    return exitCodes.api;
  }
}
