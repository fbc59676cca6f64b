// A small tmpfs of a test's own (a filesystem it can fill: full-disk tests), mounted on a directory and unmounted after.
import { execFileSync } from "node:child_process";

/** A mounted tmpfs; `unmount` is safe to call twice (a busy one is detached lazily). */
export interface Tmpfs {
  unmount(): void;
}

/**
 * Mounts a tmpfs of `sizeMiB` on `dir` (which must exist). Where that is not possible (not root): in CI an error, else
 * undefined with one line saying why, and the caller skips.
 */
export function mountTmpfs(dir: string, sizeMiB: number, name: string): Tmpfs | undefined {
  try {
    // A tmpfs is sized, not allocated: it takes what is written.
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${sizeMiB}m,mode=0700`, name, dir], { stdio: "pipe" });
  } catch (err) {
    const why = ((err as { stderr?: Buffer }).stderr?.toString() || (err as Error).message).trim();
    if (process.env.CI === "true") throw new Error(`cannot mount a tmpfs on ${dir}: ${why}`);
    console.warn(`skipping: cannot mount a tmpfs (${why})`);
    return undefined;
  }
  let mounted = true;
  return {
    unmount() {
      if (!mounted) return;
      mounted = false;
      try {
        execFileSync("umount", [dir], { stdio: "pipe" });
      } catch {
        execFileSync("umount", ["-l", dir], { stdio: "pipe" });
      }
    },
  };
}
