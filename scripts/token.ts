// `npm run token -- --tenant ten_… [--scopes a,b] [--ttl 3600] [--sub name] [--key-file path]` (or `--operator`): mints a bearer token with the gateways' signing key (SIGNING_KEY_FILE, or the dev key; cli/token.ts does it).
import { parseArgs } from "node:util";
import { CliError } from "../cli/exit.ts";
import { devTokenDefaults, mintDevToken } from "../cli/token.ts";

const d = devTokenDefaults(process.env);
const { values } = parseArgs({
  options: {
    tenant: { type: "string" },
    scopes: { type: "string", default: "agents:invoke" },
    operator: { type: "boolean", default: false },
    ttl: { type: "string", default: "3600" },
    sub: { type: "string", default: "cli" },
    "data-dir": { type: "string", default: d.dataDir },
    "key-file": { type: "string", ...(d.keyFile ? { default: d.keyFile } : {}) },
    issuer: { type: "string", default: d.issuer },
    audience: { type: "string", default: d.audience },
  },
});

try {
  const request = {
    tenant: values.tenant,
    scopes: values.scopes,
    operator: values.operator,
    ttl: values.ttl,
    subject: values.sub,
    dataDir: values["data-dir"],
    keyFile: values["key-file"],
    issuer: values.issuer,
    audience: values.audience,
  };
  console.log(await mintDevToken(request, (message) => console.error(`token: ${message}`)));
} catch (err) {
  if (!(err instanceof CliError)) throw err;
  console.error(`token: ${err.message}`);
  process.exitCode = err.exitCode;
}
