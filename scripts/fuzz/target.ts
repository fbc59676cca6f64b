// The gateway under fuzz: `scripts/start.ts` in its own process (process driver, real Postgres), its log, its RSS, tokens.
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { generateKeyPair, SignJWT, type JWK } from "jose";
import { devAudience, devIssuer, devKeyPath, mintToken } from "../../compose/dev-keys.ts";
import type { AuthKind } from "./plan.ts";

const root = fileURLToPath(new URL("../..", import.meta.url));

/** One line the gateway logged at `warn` or `error`, or printed outside the JSON log (a crash, a Node warning). */
export interface LoggedLine {
  level: string;
  line: string;
}

export interface Target {
  url: string;
  pid: number;
  child: ChildProcess;
  demo: { tenantId: string; agentId: string; token: string };
  /** The `Authorization` header values a request with these credentials carries (two for `twoHeaders`; none for `none`). */
  auth: Record<AuthKind, string[]>;
  /** Lines at `error` level, and anything printed that is not a JSON log line, since the start. */
  errors: LoggedLine[];
  warnings: LoggedLine[];
  /** The gateway process's resident set (VmRSS of /proc/<pid>/status), KiB. */
  rssKiB(): number;
  /** Exited before `stop`: its exit code or signal. */
  exited(): string | undefined;
  stop(): Promise<void>;
}

export interface TargetOptions {
  databaseUrl: string;
  dataDir: string;
  /** The environment it starts with (PORT, DATA_DIR, DRIVER, LOG_LEVEL and DATABASE_URL are set over it). */
  env: NodeJS.ProcessEnv;
}

/** Starts the gateway as `npm start` does and resolves once its banner names the URL and the demo token. */
export async function startTarget(opts: TargetOptions): Promise<Target> {
  const child = spawn(process.execPath, [join(root, "scripts/start.ts")], {
    env: { ...opts.env, PORT: "0", DATA_DIR: opts.dataDir, DRIVER: "process", LOG_LEVEL: "warn", DATABASE_URL: opts.databaseUrl },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const errors: LoggedLine[] = [];
  const warnings: LoggedLine[] = [];
  let banner = "";
  let bannerDone = false;
  const lineReader = () => {
    let pending = "";
    return (chunk: Buffer) => {
      const text = pending + chunk.toString();
      const lines = text.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) take(line);
    };
  };
  const take = (line: string) => {
    if (!bannerDone) banner += `${line}\n`;
    if (line.trim() === "") return;
    if (line.startsWith("{")) {
      try {
        const entry = JSON.parse(line) as { level?: string };
        if (entry.level === "error") errors.push({ level: "error", line });
        else if (entry.level === "warn") warnings.push({ level: "warn", line });
        return;
      } catch {
        /* not a log line: below */
      }
    }
    // The banner and the start's notices are plain text; anything after the banner that is not JSON is a crash or a warning.
    if (bannerDone) errors.push({ level: "stray", line });
  };
  child.stdout!.on("data", lineReader());
  child.stderr!.on("data", lineReader());
  let exit: string | undefined;
  child.once("exit", (code, signal) => (exit = signal ?? String(code)));

  const deadline = Date.now() + 120_000;
  for (;;) {
    const url = /gateway\s+(http:\/\/\S+)/.exec(banner)?.[1];
    const token = /token\s+(\S+)/.exec(banner)?.[1];
    if (url && token && banner.includes("Stop with Ctrl-C")) {
      bannerDone = true;
      const demoAgent = /\/a\/(agt_\w+)\//.exec(banner)?.[1] ?? "agt_demo";
      const privateJwk = JSON.parse(readFileSync(devKeyPath(opts.dataDir), "utf8")) as JWK;
      const auth = await credentials(privateJwk, token);
      return {
        url,
        pid: child.pid!,
        child,
        demo: { tenantId: "ten_demo", agentId: demoAgent, token },
        auth,
        errors,
        warnings,
        rssKiB: () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${child.pid}/status`, "utf8"))?.[1] ?? NaN),
        exited: () => exit,
        stop: () => stopChild(child),
      };
    }
    if (exit !== undefined) throw new Error(`the gateway exited (${exit}) before its banner: ${banner}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`the gateway printed no banner in 120 s: ${banner}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
  await exited;
  clearTimeout(timer);
}

/** Every kind of credentials the fuzzer sends, minted with the gateway's own dev key (and a stranger's). */
async function credentials(privateJwk: JWK, demoToken: string): Promise<Record<AuthKind, string[]>> {
  const { importJWK } = await import("jose");
  const key = await importJWK(privateJwk, "ES256");
  const signed = (claims: Record<string, unknown>, opts: { exp?: number; nbf?: number } = {}) => {
    const now = Math.floor(Date.now() / 1000);
    const jwt = new SignJWT(claims)
      .setProtectedHeader({ alg: "ES256", kid: privateJwk.kid! })
      .setIssuer(devIssuer)
      .setAudience(devAudience)
      .setSubject("fuzz")
      .setIssuedAt(now - 7200)
      .setExpirationTime(opts.exp ?? now + 24 * 3600);
    if (opts.nbf) jwt.setNotBefore(opts.nbf);
    return jwt.sign(key);
  };
  const now = Math.floor(Date.now() / 1000);
  const stranger = await generateKeyPair("ES256");
  const wrongKey = await new SignJWT({ tenant: "ten_demo", scope: "agents:invoke agents:admin usage:read" })
    .setProtectedHeader({ alg: "ES256", kid: privateJwk.kid! })
    .setIssuer(devIssuer)
    .setAudience(devAudience)
    .setExpirationTime("1h")
    .sign(stranger.privateKey);
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const algNone = `${b64({ alg: "none" })}.${b64({ tenant: "ten_demo", scope: "agents:admin", iss: devIssuer, aud: devAudience, exp: now + 3600 })}.`;
  const bearer = (t: string) => `Bearer ${t}`;
  return {
    demo: [bearer(demoToken)],
    operator: [
      bearer(
        await mintToken(privateJwk, {
          tenant: "ten_demo",
          scopes: ["agents:invoke", "agents:admin", "images:read", "images:write", "usage:read", "operator"],
          subject: "fuzz-operator",
        }),
      ),
    ],
    none: [],
    garbage: ["Bearer", "Bearer x.y.z", "Basic ZnV6ejpmdXp6", `Bearer ${"A".repeat(4000)}`, "bearer  ", "Bearer eyJ.eyJ.sig"],
    otherTenant: [bearer(await signed({ tenant: "ten_fuzzother0000", scope: "agents:invoke agents:admin usage:read" }))],
    expired: [bearer(await signed({ tenant: "ten_demo", scope: "agents:invoke agents:admin usage:read" }, { exp: now - 3600 }))],
    noScopes: [bearer(await signed({ tenant: "ten_demo", scope: "" }))],
    readOnly: [bearer(await signed({ tenant: "ten_demo", scope: "usage:read" }))],
    wrongKey: [bearer(wrongKey)],
    algNone: [bearer(algNone)],
    notYetValid: [bearer(await signed({ tenant: "ten_demo", scope: "agents:admin" }, { nbf: now + 3600 }))],
    twoHeaders: [bearer(demoToken), bearer(await signed({ tenant: "ten_fuzzother0000", scope: "agents:admin" }))],
  };
}
