// What the benchmarks share: the whole system as `npm start` runs it, in its own process, read off its banner.
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";

export interface StartedSystem {
  child: ChildProcess;
  /** The gateway's base URL and the demo tenant's token, as the banner prints them. */
  url: string;
  token: string;
}

/**
 * Starts `scripts/start.ts` with the process driver under `dataDir` (Node flags first, e.g. `--cpu-prof`); resolves
 * once its banner names the gateway and a token. `onSpawn` gets the child at once (so a failed start is still stopped);
 * `onOutput` sees everything it prints.
 */
export function startSystem(opts: {
  root: string;
  dataDir: string;
  env: NodeJS.ProcessEnv;
  databaseUrl?: string;
  nodeFlags?: string[];
  onSpawn?: (child: ChildProcess) => void;
  onOutput?: (text: string) => void;
}): Promise<StartedSystem> {
  const child = spawn(process.execPath, [...(opts.nodeFlags ?? []), join(opts.root, "scripts/start.ts")], {
    env: { ...opts.env, PORT: "0", DATA_DIR: opts.dataDir, DRIVER: "process", LOG_LEVEL: "warn", DATABASE_URL: opts.databaseUrl ?? "" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  opts.onSpawn?.(child);
  let out = "";
  return new Promise((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`the gateway did not start: ${out}`)), 120_000);
    const take = (c: Buffer) => {
      const text = c.toString();
      out += text;
      opts.onOutput?.(text);
      const url = /gateway\s+(http:\/\/\S+)/.exec(out);
      const token = /token\s+(\S+)/.exec(out);
      if (url && token) {
        clearTimeout(timer);
        res({ child, url: url[1]!, token: token[1]! });
      }
    };
    child.stdout!.on("data", take);
    child.stderr!.on("data", take);
    child.once("exit", (code) => rej(new Error(`the gateway exited (${code}): ${out}`)));
  });
}
