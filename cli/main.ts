// `agentvm`: the command line over the gateway's API (bin/agentvm.js runs this file; program.ts is the program).
import { exitCodes } from "./exit.ts";
import { run } from "./program.ts";

// A reader that went away (`agentvm logs … | head`) is no failure.
process.stdout.on("error", (err: NodeJS.ErrnoException) => process.exit(err.code === "EPIPE" ? exitCodes.ok : exitCodes.api));

process.exitCode = await run(process.argv.slice(2));
