// Runs a command's `main(argv)` when its module is the program node was started with (tests import the same module and call `main` themselves).
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** `main`'s resolved number is the exit code; a thrown error prints its message (no stack) and exits 1. */
export function runIfMain(moduleUrl: string, main: (argv: string[]) => Promise<number>): void {
  if (!process.argv[1] || fileURLToPath(moduleUrl) !== resolve(process.argv[1])) return;
  main(process.argv.slice(2)).then(
    (code) => (process.exitCode = code),
    (err: unknown) => {
      console.error(err instanceof Error ? err.message : String(err));
      process.exitCode = 1;
    },
  );
}
