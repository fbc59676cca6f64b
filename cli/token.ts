// `agentvm token` (and `npm run token`): mints a bearer token with the signing key gateways verify with (SIGNING_KEY_FILE, or the dev key in the data directory).
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import type { Command } from "commander";
import { allScopes, type Scope } from "../contracts/caller.ts";
import { devAudience, devIssuer, devKeyPath, ensureSigningKey, mintToken } from "../compose/dev-keys.ts";
import { parseDuration } from "./duration.ts";
import { usageError } from "./exit.ts";

/** What a tenant's token may carry: every scope but `operator`, which only an operator token has. */
export const tenantScopes: readonly Scope[] = allScopes.filter((s) => s !== "operator");

/** The tenant claim of an operator token when none is given (operator routes do not check it; compose/all-in-one.ts mints the same). */
export const defaultOperatorTenant = "ten_operator";

export interface DevTokenRequest {
  tenant: string | undefined;
  /** Comma list of scopes. */
  scopes: string;
  /** An operator token: scope `operator` only, tenant claim `defaultOperatorTenant` unless `tenant` says. */
  operator?: boolean;
  /** Lifetime: a duration (`1h`) or seconds (`3600`). */
  ttl: string;
  subject: string;
  dataDir: string;
  /** The signing key file (SIGNING_KEY_FILE, `--key-file`): what gateways sharing it verify with; unset: `<dataDir>/keys/dev-signing-key.json`. */
  keyFile?: string | undefined;
  issuer: string;
  audience: string;
}

/** The defaults both commands share: the data directory, signing key file, issuer and audience a dev gateway uses (DATA_DIR, SIGNING_KEY_FILE, JWT_ISSUER, JWT_AUDIENCE). */
export function devTokenDefaults(env: NodeJS.ProcessEnv) {
  return {
    dataDir: env.DATA_DIR ?? ".data",
    keyFile: env.SIGNING_KEY_FILE || undefined,
    issuer: env.JWT_ISSUER ?? devIssuer,
    audience: env.JWT_AUDIENCE ?? devAudience,
  };
}

/** A token of the key at `keyFile`, else of the dev key under `dataDir` (created when missing, said on `notice`); bad input is a usage error. */
export async function mintDevToken(req: DevTokenRequest, notice: (message: string) => void): Promise<string> {
  const tenant = req.tenant ?? (req.operator ? defaultOperatorTenant : undefined);
  if (!tenant) throw usageError("--tenant is required (the demo tenant is ten_demo), or --operator for an operator token");
  const scopes = req.operator
    ? ["operator"]
    : req.scopes
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
  const unknown = scopes.filter((s) => !(allScopes as readonly string[]).includes(s));
  if (unknown.length) throw usageError(`unknown scope(s) ${unknown.join(", ")}; known: ${allScopes.join(", ")}`);
  const ttlMs = parseDuration(req.ttl, "--ttl");
  const ttlS = Math.round(ttlMs / 1000);
  if (!Number.isInteger(ttlS) || ttlS <= 0) throw usageError("--ttl must be a positive duration (3600, 30m, 1h)");
  const dataDir = resolve(req.dataDir);
  const keyFile = req.keyFile ? resolve(req.keyFile) : devKeyPath(dataDir);
  if (!existsSync(keyFile)) {
    notice(
      req.keyFile
        ? `no signing key at ${keyFile} yet; creating one (start the gateways with SIGNING_KEY_FILE=${keyFile})`
        : `no dev key in ${dataDir} yet; creating one (start the system with the same DATA_DIR)`,
    );
  }
  const keys = await ensureSigningKey(keyFile);
  return mintToken(keys.privateJwk, { tenant, scopes: scopes as Scope[], ttlS, subject: req.subject, issuer: req.issuer, audience: req.audience });
}

export function tokenCommand(program: Command): void {
  const d = devTokenDefaults(process.env);
  program
    .command("token")
    .description(
      "mint a token with the signing key gateways verify with when no JWKS is set: --key-file (SIGNING_KEY_FILE), or the dev key of a local data directory",
    )
    .option("--tenant <id>", "the tenant the token speaks for (npm start's demo tenant is ten_demo); required unless --operator")
    .option("--scopes <list>", `comma list of ${allScopes.join(", ")}`, tenantScopes.join(","))
    .option("--operator", `an operator token: scope operator only (tenants, rate cards), tenant claim ${defaultOperatorTenant} unless --tenant`)
    .option("--ttl <duration>", "lifetime (3600, 30m, 12h)", "1h")
    .option("--sub <subject>", "the token's subject", "cli")
    .option("--data-dir <dir>", "the data directory holding the dev key ($DATA_DIR)", d.dataDir)
    .option(
      "--key-file <path>",
      "the signing key file the gateways share ($SIGNING_KEY_FILE; made there when missing); instead of the data directory's",
      d.keyFile,
    )
    .option("--issuer <iss>", "issuer ($JWT_ISSUER)", d.issuer)
    .option("--audience <aud>", "audience ($JWT_AUDIENCE)", d.audience)
    .action(
      async (
        o: {
          tenant?: string;
          scopes: string;
          operator?: boolean;
          ttl: string;
          sub: string;
          dataDir: string;
          keyFile?: string;
          issuer: string;
          audience: string;
        },
        cmd: Command,
      ) => {
        const token = await mintDevToken(
          {
            tenant: o.tenant,
            scopes: o.scopes,
            operator: o.operator === true,
            ttl: o.ttl,
            subject: o.sub,
            dataDir: o.dataDir,
            keyFile: o.keyFile,
            issuer: o.issuer,
            audience: o.audience,
          },
          (m) => console.error(`token: ${m}`),
        );
        if (cmd.optsWithGlobals<{ json?: boolean }>().json) console.log(JSON.stringify({ token }));
        else console.log(token);
      },
    );
}
