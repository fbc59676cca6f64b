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

let gccSeen: string | undefined;

/** gcc's first `--version` line (part of the key of whatever it builds), or `none` without gcc. */
export function gccVersion(): string {
  if (gccSeen === undefined) {
    const r = spawnSync("gcc", ["--version"], { encoding: "utf8" });
    gccSeen = r.status === 0 ? (r.stdout.split("\n")[0] ?? "gcc") : "none";
  }
  return gccSeen;
}

/**
 * Compiles `sources` into the static program `output` (`gcc -static -O2 -Wall`, then `flags`): what runs in a guest or
 * in any image, whatever its libc (the guest image's programs, the desktop base's `call`). Answers gcc's complaint
 * (`missing`: no gcc at all), or undefined when it built.
 */
export function compileStatic(sources: readonly string[], output: string, flags: readonly string[] = []): { missing?: true; stderr: string } | undefined {
  const r = spawnSync("gcc", ["-static", "-O2", "-Wall", "-o", output, ...sources, ...flags], { encoding: "utf8" });
  if (r.error) return { missing: true, stderr: r.error.message };
  return r.status === 0 ? undefined : { stderr: r.stderr ?? "" };
}
