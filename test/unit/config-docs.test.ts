// docs/configuration.md cannot drift from the programs' configuration schemas: `npm run docs -- --check` fails when it differs.
import { describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { configurationDocument } from "../../compose/config/document.ts";
import { programs } from "../../compose/config/programs.ts";

const script = fileURLToPath(new URL("../../scripts/docs.ts", import.meta.url));
const committed = fileURLToPath(new URL("../../docs/configuration.md", import.meta.url));

function docs(args: string[]): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) =>
    execFile(process.execPath, [script, ...args], (error, out, err) => resolve({ code: error ? Number(error.code ?? 1) : 0, out, err })),
  );
}

describe("npm run docs", () => {
  it("--check passes on the committed docs/configuration.md (run `npm run docs` after changing a variable)", async () => {
    const r = await docs(["--check"]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
    expect(readFileSync(committed, "utf8")).toBe(configurationDocument());
  }, 60_000);

  it("--check fails, naming the file, when it differs from what the schemas describe", async () => {
    const dir = mkdtempSync(join(tmpdir(), "agentvm-docs-"));
    try {
      const out = join(dir, "configuration.md");
      expect((await docs(["--out", out])).code).toBe(0);
      expect((await docs(["--check", "--out", out])).code).toBe(0);
      writeFileSync(out, readFileSync(out, "utf8").replace("| `PORT` | integer, 0–65535 | `8080` |", "| `PORT` | integer, 0–65535 | `8081` |"));
      const stale = await docs(["--check", "--out", out]);
      expect(stale.code).toBe(1);
      expect(stale.err).toContain(`${out} is not what the configuration schemas describe`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it("has one table per program, each listing every variable of its schema", () => {
    const doc = configurationDocument();
    for (const p of programs) {
      const section = doc.split(`## ${p.title}\n`)[1]!.split("\n## ")[0]!;
      for (const name of Object.keys(p.schema.shape)) expect(section, `${name} in ${p.title}`).toContain(`| \`${name}\` |`);
    }
  });
});
