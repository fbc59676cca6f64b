// `agentvm login --url URL --token TOKEN`: keeps the gateway and token in the config file for later commands.
import type { Command } from "commander";
import type { GlobalOptions } from "./context.ts";
import { configFile, defaultUrl, writeConfig } from "./config.ts";
import { usageError } from "./exit.ts";
import { tokenClaims } from "./tenants.ts";

export function loginCommand(program: Command): void {
  program
    .command("login")
    .description(`keep --url and --token in ${configFile(process.env).replace(process.env.HOME || "\0", "~")} (mode 0600) for later commands`)
    .addHelpText("after", `\nExample: agentvm login --url ${defaultUrl} --token <the token npm start prints>`)
    .action((_o: unknown, cmd: Command) => {
      // --url and --token are the program's options: a command's own of the same name would never see them.
      const { url, token } = cmd.optsWithGlobals<GlobalOptions>();
      if (!url || !token) throw usageError(`login needs --url and --token (agentvm login --url ${defaultUrl} --token TOKEN)`);
      const file = configFile(process.env);
      writeConfig(file, { url, token });
      let tenant: string | null = null;
      try {
        tenant = tokenClaims(token).tenant;
      } catch {
        // a token that is no JWT may still be one the gateway takes
      }
      console.log(`saved ${url}${tenant ? ` (tenant ${tenant})` : ""} to ${file}`);
    });
}
