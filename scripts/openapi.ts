// `npm run openapi [-- --check] [--dir DIR]`: writes the gateway's OpenAPI document to contracts/api/openapi.json and the types generated from it (the CLI's client, the dashboard's answers) to contracts/api/types.ts, and their copy in the TypeScript SDK (sdk/typescript/src/api-types.ts, which is published alone); --check exits 1 when any differs.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import openapiTS, { type OpenAPI3 } from "openapi-typescript";
import { apiDocument } from "../compose/api-document.ts";

const apiDir = fileURLToPath(new URL("../contracts/api/", import.meta.url));
const sdkTypes = fileURLToPath(new URL("../sdk/typescript/src/api-types.ts", import.meta.url));

const header = "// The API's types, generated from contracts/api/openapi.json by `npm run openapi` (openapi-typescript): do not edit.\n";

/**
 * An object with named properties and a schema for the others (`{ok: true, database: "up"}`) is, in TypeScript, an
 * index signature that every named property must also fit: openapi-typescript 6 prints the others' type alone, which
 * does not compile. Its copy of the document gets the union (the document itself stays as the code says).
 */
function widenIndexSignatures(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(widenIndexSignatures);
  if (typeof node !== "object" || node === null) return node;
  const out = Object.fromEntries(Object.entries(node).map(([k, v]) => [k, widenIndexSignatures(v)])) as Record<string, unknown>;
  const extra = out.additionalProperties;
  const named = out.properties as Record<string, unknown> | undefined;
  if (typeof extra === "object" && extra !== null && named && Object.keys(named).length > 0) {
    out.additionalProperties = { anyOf: [extra, ...Object.values(named)] };
  }
  return out;
}

/** The document as committed and the types generated from it, both from the code as it is now. */
async function generated(): Promise<{ document: string; types: string }> {
  const document = `${JSON.stringify(apiDocument(), null, 2)}\n`;
  // openapi-typescript resolves references in what it is given: it gets its own copy.
  const types = await openapiTS(widenIndexSignatures(JSON.parse(document)) as OpenAPI3, { commentHeader: header, silent: true, exportType: true });
  return { document, types };
}

function readOr(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

async function main(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({ args: argv, options: { check: { type: "boolean", default: false }, dir: { type: "string", default: apiDir } } }));
  } catch (err) {
    console.error(`openapi: ${(err as Error).message}\nusage: npm run openapi [-- --check] [--dir DIR (default contracts/api/)]`);
    return 2;
  }
  const { document, types } = await generated();
  const files = [
    { path: join(values.dir, "openapi.json"), text: document },
    { path: join(values.dir, "types.ts"), text: types },
    ...(values.dir === apiDir ? [{ path: sdkTypes, text: types }] : []),
  ];
  if (!values.check) {
    for (const f of files) writeFileSync(f.path, f.text);
    console.log(`wrote ${files.map((f) => f.path).join(" and ")}`);
    return 0;
  }
  const stale = files.filter((f) => readOr(f.path) !== f.text);
  for (const f of stale) console.error(`openapi: ${f.path} is not what the code describes: run npm run openapi and commit it`);
  return stale.length > 0 ? 1 : 0;
}

process.exitCode = await main(process.argv.slice(2));
