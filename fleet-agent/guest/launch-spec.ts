// The launcher's input (launch.c): an image's command, environment, workdir and ids encoded as NUL-terminated strings.
//
// Format (version 1), every string ends in one NUL byte:
//   "agentvm-launch/1"  "uid=<n>"  "gid=<n>"  "workdir=<absolute path>"
//   "argc=<n>"  <n strings: entrypoint then cmd>  "envc=<m>"  <m strings: KEY=value>
// NUL-separated because arguments and values may hold any other byte (spaces, quotes, newlines); nothing here is
// ever parsed by a shell. The environment is the image's, then `extraEnv`, with a later KEY replacing an earlier one
// in place (libc's getenv takes the first match, so duplicates would make the image's value win).
import type { ImageConfig } from "../../contracts/image.ts";

export const LAUNCH_SPEC_MAGIC = "agentvm-launch/1";

/** What the launcher runs; `encodeLaunchSpec`'s result decoded (tests, diagnostics). */
export interface LaunchSpec {
  argv: string[];
  env: string[];
  workdir: string;
  uid: number;
  gid: number;
}

/**
 * The spec file for `launch <root> <spec-file>`: argv = entrypoint + cmd, env = the image's env then `extraEnv`
 * (the host's `PORT`, `AGENT_ID`, `LEASE_DIR`, …; a later KEY wins). Throws on what the launcher could not run: an
 * empty command, a relative workdir, a NUL byte in a string, an env entry without `=`, ids out of range.
 */
export function encodeLaunchSpec(config: ImageConfig, extraEnv: string[]): Buffer {
  const argv = [...config.entrypoint, ...config.cmd];
  if (argv.length === 0) throw new Error("image has no command (entrypoint and cmd are empty)");
  const workdir = config.workdir || "/";
  if (!workdir.startsWith("/")) throw new Error(`image workdir must be absolute: ${workdir}`);
  for (const [name, id] of [
    ["uid", config.uid],
    ["gid", config.gid],
  ] as const) {
    if (!Number.isInteger(id) || id < 0 || id > 0xfffffffe) throw new Error(`image ${name} out of range: ${id}`);
  }
  const env = mergeEnv([...config.env, ...extraEnv]);
  const strings = [
    LAUNCH_SPEC_MAGIC,
    `uid=${config.uid}`,
    `gid=${config.gid}`,
    `workdir=${workdir}`,
    `argc=${argv.length}`,
    ...argv,
    `envc=${env.length}`,
    ...env,
  ];
  for (const s of strings) if (s.includes("\0")) throw new Error(`a NUL byte in the image's command or environment: ${JSON.stringify(s.slice(0, 60))}`);
  return Buffer.from(strings.map((s) => `${s}\0`).join(""), "utf8");
}

/** `KEY=value` entries with each KEY once, at its first position, holding its last value. */
export function mergeEnv(entries: readonly string[]): string[] {
  const byKey = new Map<string, string>();
  for (const e of entries) {
    const eq = e.indexOf("=");
    if (eq <= 0) throw new Error(`environment entry is not KEY=value: ${JSON.stringify(e.slice(0, 60))}`);
    byKey.set(e.slice(0, eq), e);
  }
  return [...byKey.values()];
}

/** Reads a spec file back (the inverse of `encodeLaunchSpec`). */
export function decodeLaunchSpec(data: Uint8Array): LaunchSpec {
  const text = Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8");
  if (!text.endsWith("\0")) throw new Error("launch spec is not NUL-terminated");
  const strings = text.slice(0, -1).split("\0");
  let i = 0;
  const take = (what: string): string => {
    const s = strings[i++];
    if (s === undefined) throw new Error(`launch spec ends before ${what}`);
    return s;
  };
  const keyed = (key: string): string => {
    const s = take(key);
    if (!s.startsWith(`${key}=`)) throw new Error(`launch spec: expected ${key}=, found ${JSON.stringify(s.slice(0, 40))}`);
    return s.slice(key.length + 1);
  };
  const count = (key: string): number => {
    const n = Number(keyed(key));
    if (!Number.isInteger(n) || n < 0) throw new Error(`launch spec: bad ${key}`);
    return n;
  };
  if (take("the header") !== LAUNCH_SPEC_MAGIC) throw new Error("launch spec: unknown format");
  const uid = count("uid");
  const gid = count("gid");
  const workdir = keyed("workdir");
  const argv = Array.from({ length: count("argc") }, () => take("argv"));
  const env = Array.from({ length: count("envc") }, () => take("env"));
  if (i !== strings.length) throw new Error("launch spec has data after the environment");
  return { argv, env, workdir, uid, gid };
}

/** The launcher's C source, for drivers that compile it for the host (`gcc -static -O2 -o launch <this>`). */
export const launchSource = `${import.meta.dirname}/launch.c`;
