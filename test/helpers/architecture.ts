// Reads ARCHITECTURE.md's folder table and the imports of our sources, and lists every import that breaks a rule.

export interface FolderRule {
  /** `gateway/`, `fleet-agent/drivers/`, … */
  folder: string;
  /** Folders its files may import besides their own subtree; undefined: anything. */
  mayImport: string[] | undefined;
}

export interface Import {
  specifier: string;
  /** Repository path of a relative import (`gateway/app.ts`), else the specifier as written. */
  target: string;
  /** `import type …`, `export type …`, or only `type` names: erased at run time. */
  typeOnly: boolean;
}

export interface SourceFile {
  path: string;
  imports: Import[];
}

/** The rows of the table whose header is `| folder | owns | may import |`. */
export function parseRules(markdown: string): FolderRule[] {
  const rules: FolderRule[] = [];
  let inTable = false;
  for (const line of markdown.split("\n")) {
    if (/^\|\s*folder\s*\|.*may import\s*\|\s*$/.test(line)) {
      inTable = true;
      continue;
    }
    if (!inTable) continue;
    if (!line.startsWith("|")) break;
    const cells = line
      .split("|")
      .slice(1, -1)
      .map((c) => c.trim());
    const folder = /^`([^`]+\/)`$/.exec(cells[0] ?? "")?.[1];
    if (!folder) continue; // the |---| row
    const last = cells[cells.length - 1] ?? "";
    const mayImport = last === "(anything)" ? undefined : [...last.matchAll(/`([^`]+\/)`/g)].map((m) => m[1]!);
    rules.push({ folder, mayImport });
  }
  return rules;
}

const importPattern =
  /(?:^|\n)\s*(import|export)\s+(type\s+)?([^;'"]*?)\s*from\s*["']([^"']+)["']|(?:^|\n)\s*import\s*["']([^"']+)["']|import\(\s*["']([^"']+)["']\s*\)/g;

/** Static imports and re-exports, side-effect imports and literal dynamic imports of a TypeScript file. */
export function parseImports(source: string): Omit<Import, "target">[] {
  const code = source.replace(/\/\*[\s\S]*?\*\//g, "").replace(/(^|[^:"'`])\/\/[^\n]*/g, "$1");
  const out: Omit<Import, "target">[] = [];
  for (const m of code.matchAll(importPattern)) {
    if (m[4]) {
      const clause = m[3] ?? "";
      const names = /\{([^}]*)\}/.exec(clause)?.[1];
      const onlyTypeNames =
        names !== undefined &&
        !/^[^{]*\w[^{]*\{/.test(clause) &&
        names
          .split(",")
          .map((n) => n.trim())
          .filter(Boolean)
          .every((n) => n.startsWith("type "));
      out.push({ specifier: m[4], typeOnly: m[2] !== undefined || onlyTypeNames });
    } else {
      out.push({ specifier: (m[5] ?? m[6])!, typeOnly: false });
    }
  }
  return out;
}

const nodeOnlyPackages = ["undici", "ws", "@hono/node-server", "@electric-sql/pglite", "postgres"];
/** Our files that only run on Node: the gateway core must not import them (types excepted). */
const nodeOnlyFiles = [
  /^lib\/node-[^/]+\.ts$/,
  /^schema\/db\.ts$/,
  /^gateway\/node\//,
  /^fleet-agent\//,
  /^compose\//,
  /^scripts\//,
  /^images\/build\//,
  /^images\/node-builder\.ts$/,
  /^images\/vm-build\//,
];

/** Files the Worker bundles too: the gateway core and the image routes beside it (not the image builder). */
function runtimeFree(path: string): boolean {
  if (path.startsWith("gateway/")) return !path.startsWith("gateway/node/");
  return path.startsWith("images/") && !nodeOnlyFiles.some((re) => re.test(path));
}

function ruleOf(path: string, rules: FolderRule[]): FolderRule | undefined {
  let best: FolderRule | undefined;
  for (const r of rules) if (path.startsWith(r.folder) && (!best || r.folder.length > best.folder.length)) best = r;
  return best;
}

function ours(target: string): boolean {
  return !target.startsWith("node:") && /\.ts$/.test(target) && !target.startsWith("/") && !target.includes("node_modules");
}

export function checkImports(files: SourceFile[], rules: FolderRule[]): string[] {
  const problems: string[] = [];
  for (const file of files) {
    const rule = ruleOf(file.path, rules);
    if (!rule) {
      if (file.path.includes("/")) problems.push(`${file.path} is in no folder of ARCHITECTURE.md`);
      continue;
    }
    const inCore = runtimeFree(file.path);
    for (const imp of file.imports) {
      if (inCore && !imp.typeOnly) {
        const runtime =
          imp.target.startsWith("node:") ||
          nodeOnlyPackages.some((p) => imp.target === p || imp.target.startsWith(`${p}/`)) ||
          nodeOnlyFiles.some((re) => re.test(imp.target));
        if (runtime)
          problems.push(
            `${file.path} imports ${imp.target}: the gateway core and the image routes are runtime-free (Node code goes in gateway/node/ or images/build/)`,
          );
      }
      if (!ours(imp.target) || rule.mayImport === undefined) continue;
      const own = imp.target.startsWith(rule.folder);
      const allowed = own || rule.mayImport.some((f) => imp.target.startsWith(f));
      if (!allowed)
        problems.push(
          `${file.path} imports ${imp.target}: ${rule.folder} may import ${rule.mayImport.length ? rule.mayImport.join(", ") : "nothing of ours"} (ARCHITECTURE.md)`,
        );
    }
  }
  problems.push(...cycles(files));
  return problems;
}

/** Import cycles between our files (type-only imports included: a cycle of types still ties two files together). */
function cycles(files: SourceFile[]): string[] {
  const graph = new Map<string, string[]>();
  for (const f of files)
    graph.set(
      f.path,
      f.imports.map((i) => i.target).filter((t) => ours(t)),
    );
  const state = new Map<string, "open" | "done">();
  const stack: string[] = [];
  const found: string[] = [];
  const seen = new Set<string>();
  const visit = (node: string) => {
    state.set(node, "open");
    stack.push(node);
    for (const next of graph.get(node) ?? []) {
      if (!graph.has(next)) continue;
      if (state.get(next) === "open") {
        const loop = [...stack.slice(stack.indexOf(next)), next];
        const key = [...loop.slice(0, -1)].sort().join(" ");
        if (!seen.has(key)) {
          seen.add(key);
          found.push(`cycle: ${loop.join(" → ")}`);
        }
      } else if (!state.has(next)) visit(next);
    }
    stack.pop();
    state.set(node, "done");
  };
  for (const node of [...graph.keys()].sort()) if (!state.has(node)) visit(node);
  return found;
}
