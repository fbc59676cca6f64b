// `agentvm token` (and `npm run token`): mints a bearer token with the dev signing key in the data directory.
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import type { Command } from "commander";
import { allScopes, type Scope } from "../contracts/caller.ts";
import { devKeyPath, ensureDevKeys, mintToken } from "../compose/dev-keys.ts";
import { parseDuration } from "./duration.ts";
import { usageError } from "./exit.ts";

export interface DevTokenRequest {
  tenant: string | undefined;
  /** Comma list of scopes. */
  scopes: string;
  /** Lifetime: a duration (`1h`) or seconds (`3600`). */
  ttl: string;
  subject: string;
  dataDir: string;
  issuer: string;
  audience: string;
}

/** The defaults both commands share: the data directory, issuer and audience a dev gateway uses (DATA_DIR, JWT_ISSUER, JWT_AUDIENCE). */
export function devTokenDefaults(env: NodeJS.ProcessEnv) {
  return { dataDir: env.DATA_DIR ?? ".data", issuer: env.JWT_ISSUER ?? "agentvm-dev", audience: env.JWT_AUDIENCE ?? "agentvm" };
}

/** A token of the dev key under `dataDir` (created there when missing, said on `notice`); bad input is a usage error. */
export async function mintDevToken(req: DevTokenRequest, notice: (message: string) => void): Promise<string> {
  if (!req.tenant) throw usageError("--tenant is required (the demo tenant is ten_demo)");
  const scopes = req.scopes.split(",").map((s) => s.trim()).filter(Boolean);
  const unknown = scopes.filter((s) => !(allScopes as readonly string[]).includes(s));
  if (unknown.length) throw usageError(`unknown scope(s) ${unknown.join(", ")}; known: ${allScopes.join(", ")}`);
  const ttlMs = parseDuration(req.ttl, "--ttl");
  const ttlS = Math.round(ttlMs / 1000);
  if (!Number.isInteger(ttlS) || ttlS <= 0) throw usageError("--ttl must be a positive duration (3600, 30m, 1h)");
  const dataDir = resolve(req.dataDir);
  if (!existsSync(devKeyPath(dataDir))) notice(`no dev key in ${dataDir} yet; creating one (start the system with the same DATA_DIR)`);
  const keys = await ensureDevKeys(dataDir);
  return mintToken(keys.privateJwk, { tenant: req.tenant, scopes: scopes as Scope[], ttlS, subject: req.subject, issuer: req.issuer, audience: req.audience });
}

export function tokenCommand(program: Command): void {
  const d = devTokenDefaults(process.env);
  program
    .command("token")
    .description("mint a token with the dev signing key of a local data directory (what npm start accepts without a JWKS)")
    .requiredOption("--tenant <id>", "the tenant the token speaks for (npm start's demo tenant is ten_demo)")
    .option("--scopes <list>", `comma list of ${allScopes.join(", ")}`, allScopes.join(","))
    .option("--ttl <duration>", "lifetime (3600, 30m, 12h)", "1h")
    .option("--sub <subject>", "the token's subject", "cli")
    .option("--data-dir <dir>", "the data directory holding the dev key ($DATA_DIR)", d.dataDir)
    .option("--issuer <iss>", "issuer ($JWT_ISSUER)", d.issuer)
    .option("--audience <aud>", "audience ($JWT_AUDIENCE)", d.audience)
    .action(async (o: { tenant: string; scopes: string; ttl: string; sub: string; dataDir: string; issuer: string; audience: string }, cmd: Command) => {
      const token = await mintDevToken({ tenant: o.tenant, scopes: o.scopes, ttl: o.ttl, subject: o.sub, dataDir: o.dataDir, issuer: o.issuer, audience: o.audience }, (m) => console.error(`token: ${m}`));
      if (cmd.optsWithGlobals<{ json?: boolean }>().json) console.log(JSON.stringify({ token }));
      else console.log(token);
    });
}
