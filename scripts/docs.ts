// `npm run docs [-- --check] [--out FILE]`: writes docs/configuration.md from the programs' configuration schemas; --check exits 1 when the file differs.
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { configurationDocument } from "../compose/config/document.ts";

const defaultOut = fileURLToPath(new URL("../docs/configuration.md", import.meta.url));

function readOr(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

function main(argv: string[]): number {
  let values;
  try {
    ({ values } = parseArgs({ args: argv, options: { check: { type: "boolean", default: false }, out: { type: "string", default: defaultOut } } }));
  } catch (err) {
    console.error(`docs: ${(err as Error).message}\nusage: npm run docs [-- --check] [--out FILE (default docs/configuration.md)]`);
    return 2;
  }
  const text = configurationDocument();
  if (values.check) {
    if (readOr(values.out) === text) return 0;
    console.error(`docs: ${values.out} is not what the configuration schemas describe: run npm run docs and commit it`);
    return 1;
  }
  mkdirSync(dirname(values.out), { recursive: true });
  writeFileSync(values.out, text);
  console.log(`wrote ${values.out}`);
  return 0;
}

process.exitCode = main(process.argv.slice(2));
