// The `agentvm` command line run as a child process (`node bin/agentvm.js …`), as its tests drive it.
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect } from "vitest";
import { startSystem, type TestSystem } from "./system.ts";

export const agentvmBin = fileURLToPath(new URL("../../bin/agentvm.js", import.meta.url));

export interface CliRun {
  code: number;
  out: string;
  err: string;
}

/** Runs `agentvm args` against `url` with `token`, its config under `home`; the exit code, stdout and stderr. */
export function runAgentvm(args: readonly string[], opts: { url: string; token: string; home: string }): Promise<CliRun> {
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: opts.home, AGENTVM_URL: opts.url, AGENTVM_TOKEN: opts.token };
  return new Promise((resolve) => {
    execFile(process.execPath, [agentvmBin, ...args], { env, timeout: 60_000 }, (error, out, err) =>
      resolve({ code: error ? Number(error.code ?? 1) : 0, out, err }),
    );
  });
}

/** The JSON a successful `--json` run printed (the test fails with its stderr otherwise). */
export function cliJson<T>(r: CliRun): T {
  expect(r.code, r.err).toBe(0);
  return JSON.parse(r.out) as T;
}

/**
 * A system started before the file's tests and stopped after them, and `agentvm` against it with a home of its own:
 * the operator token `npm start` prints unless a call names another.
 */
export function cliSystem(name: string): { readonly sys: TestSystem; agentvm(args: readonly string[], token?: string): Promise<CliRun> } {
  let sys: TestSystem | undefined;
  let home: string | undefined;
  beforeAll(async () => {
    sys = await startSystem();
    home = mkdtempSync(join(tmpdir(), `agentvm-cli-${name}-home-`));
  }, 60_000);
  afterAll(async () => {
    await sys?.stop();
    if (home) rmSync(home, { recursive: true, force: true });
  });
  const started = (): TestSystem => sys ?? expect.fail("the system did not start");
  return {
    get sys() {
      return started();
    },
    agentvm: (args, token) => runAgentvm(args, { url: started().url, token: token ?? started().operatorToken, home: home! }),
  };
}
