// The layout holds: every import of our own files follows ARCHITECTURE.md's table, no file cycles, a runtime-free gateway core.
import { describe, expect, it } from "vitest";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import { checkImports, parseImports, parseRules, type SourceFile } from "../helpers/architecture.ts";

const root = join(import.meta.dirname, "..", "..");
const skipDirs = new Set(["node_modules", ".git", ".data", "dist", ".wrangler", "test"]);

function sources(dir = root): SourceFile[] {
  const out: SourceFile[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (entry.isDirectory()) {
      if (!skipDirs.has(entry.name) && !entry.name.startsWith(".")) out.push(...sources(join(dir, entry.name)));
    } else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts")) {
      const path = relative(root, join(dir, entry.name));
      out.push({
        path,
        imports: parseImports(readFileSync(join(dir, entry.name), "utf8")).map((i) => ({
          ...i,
          target: i.specifier.startsWith(".") ? normalize(join(dirname(path), i.specifier)) : i.specifier,
        })),
      });
    }
  }
  return out;
}

describe("the layout of ARCHITECTURE.md", () => {
  const rules = parseRules(readFileSync(join(root, "ARCHITECTURE.md"), "utf8"));
  const files = sources();

  it("has a row for every top-level folder with code", () => {
    const tops = new Set(files.map((f) => f.path.split("/")[0]!).filter((t) => !t.endsWith(".ts")));
    for (const top of tops)
      expect(
        rules.some((r) => r.folder === `${top}/`),
        `ARCHITECTURE.md has no row for ${top}/`,
      ).toBe(true);
    expect(files.length).toBeGreaterThan(100);
  });

  it("every import of our files is one its folder may make; no cycles; the gateway core imports no runtime", () => {
    expect(checkImports(files, rules)).toEqual([]);
  });

  it("catches each kind of violation (the checker itself)", () => {
    const probe: SourceFile[] = [
      { path: "billing/x.ts", imports: [{ specifier: "../gateway/auth.ts", target: "gateway/auth.ts", typeOnly: true }] },
      {
        path: "gateway/a.ts",
        imports: [
          { specifier: "./b.ts", target: "gateway/b.ts", typeOnly: false },
          { specifier: "node:fs", target: "node:fs", typeOnly: false },
        ],
      },
      {
        path: "gateway/b.ts",
        imports: [
          { specifier: "./a.ts", target: "gateway/a.ts", typeOnly: true },
          { specifier: "../lib/node-respond.ts", target: "lib/node-respond.ts", typeOnly: false },
        ],
      },
      { path: "gateway/c.ts", imports: [{ specifier: "undici", target: "undici", typeOnly: true }] },
    ];
    const problems = checkImports(probe, rules);
    expect(problems).toContainEqual(expect.stringContaining("billing/x.ts imports gateway/auth.ts"));
    expect(problems).toContainEqual(expect.stringContaining("cycle: gateway/a.ts → gateway/b.ts → gateway/a.ts"));
    expect(problems).toContainEqual(expect.stringContaining("gateway/a.ts imports node:fs"));
    expect(problems).toContainEqual(expect.stringContaining("gateway/b.ts imports lib/node-respond.ts"));
    expect(problems.some((p) => p.includes("gateway/c.ts"))).toBe(false); // a type-only import of a Node package is fine
  });
});
