// `npm run token -- --tenant ten_… [--scopes a,b] [--ttl 3600] [--sub name]`: mints a bearer token with the dev key.
import { parseArgs } from "node:util";
import { resolve } from "node:path";
import { existsSync } from "node:fs";
import { allScopes, type Scope } from "../contracts/caller.ts";
import { devKeyPath, ensureDevKeys, mintToken } from "../compose/dev-keys.ts";

const { values } = parseArgs({
  options: {
    tenant: { type: "string" },
    scopes: { type: "string", default: "agents:invoke" },
    ttl: { type: "string", default: "3600" },
    sub: { type: "string", default: "cli" },
    "data-dir": { type: "string", default: process.env.DATA_DIR ?? ".data" },
    issuer: { type: "string", default: process.env.JWT_ISSUER ?? "agentvm-dev" },
    audience: { type: "string", default: process.env.JWT_AUDIENCE ?? "agentvm" },
  },
});

function die(message: string): never {
  console.error(`token: ${message}`);
  process.exit(2);
}

if (!values.tenant) die("--tenant is required (the demo tenant is ten_demo)");
const scopes = values.scopes.split(",").map((s) => s.trim());
const unknown = scopes.filter((s) => !(allScopes as readonly string[]).includes(s));
if (unknown.length) die(`unknown scope(s) ${unknown.join(", ")}; known: ${allScopes.join(", ")}`);
const ttl = Number(values.ttl);
if (!Number.isInteger(ttl) || ttl <= 0) die("--ttl must be a positive number of seconds");
const dataDir = resolve(values["data-dir"]);
if (!existsSync(devKeyPath(dataDir))) console.error(`token: no dev key in ${dataDir} yet; creating one (start the system with the same DATA_DIR)`);
const keys = await ensureDevKeys(dataDir);
console.log(await mintToken(keys.privateJwk, { tenant: values.tenant, scopes: scopes as Scope[], ttlS: ttl, subject: values.sub, issuer: values.issuer, audience: values.audience }));
