// Builds a small C helper of this project with gcc on first use, once per source: the binary is cached in a per-user
// temp directory under a name holding the source's hash (a change rebuilds it; a concurrent build renames over it).
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The compiled helper's path, or why it cannot be built (no gcc, a compile error): the caller then does without it. */
export type CTool = { path: string } | { error: string };

/** A per-user cache directory for compiled helpers: `<tmp>/agentvm-<kind>-<uid>`. */
export function toolCacheDir(kind: string): string {
  return join(tmpdir(), `agentvm-${kind}-${process.getuid?.() ?? "user"}`);
}

/**
 * `source`: the .c file, or its text; `name`: the binary's name before the hash; `dir`: where it is cached;
 * `shared`: a shared object (`<name>-<hash>.so`, for LD_PRELOAD) instead of a program.
 */
export function buildCTool(source: { file: string } | { text: string }, name: string, dir: string, opts: { shared?: boolean } = {}): CTool {
  let src: string | undefined;
  try {
    const text = "text" in source ? source.text : readFileSync(source.file, "utf8");
    const hash = createHash("sha256").update(text).digest("hex").slice(0, 12);
    const path = join(dir, `${name}-${hash}${opts.shared ? ".so" : ""}`);
    if (existsSync(path)) return { path };
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const tmp = `${path}.${process.pid}.tmp`;
    if ("text" in source) writeFileSync((src = `${tmp}.c`), text);
    const file = src ?? (source as { file: string }).file;
    const r = spawnSync("gcc", [...(opts.shared ? ["-shared", "-fPIC"] : []), "-O2", "-Wall", "-o", tmp, file], { encoding: "utf8" });
    if (r.error) return { error: `gcc not available: ${r.error.message}` };
    if (r.status !== 0) {
      rmSync(tmp, { force: true });
      return { error: `gcc failed: ${r.stderr.trim().split("\n").pop()}` };
    }
    renameSync(tmp, path);
    return { path };
  } catch (err) {
    return { error: (err as Error).message };
  } finally {
    if (src) rmSync(src, { force: true });
  }
}
