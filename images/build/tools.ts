// Finds the image tools (buildah, skopeo, umoci, debootstrap, e2fsprogs) and has the missing ones installed.
import { accessSync, constants } from "node:fs";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";

/** Each command we run, and the Debian package that brings it. */
export const imageTools = {
  buildah: "buildah",
  skopeo: "skopeo",
  umoci: "umoci",
  debootstrap: "debootstrap",
  mke2fs: "e2fsprogs",
  debugfs: "e2fsprogs",
  dumpe2fs: "e2fsprogs",
} as const;

export type ImageTool = keyof typeof imageTools;

// Where Debian's packages put them (debootstrap and mke2fs in /usr/sbin, which a non-login shell's PATH may lack); the
// environment's PATH is not consulted, so what runs does not depend on who started us.
const searchDirs = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
const found = new Map<string, string>();

/** Absolute path of a tool, or undefined; remembered once found. */
export function toolPath(tool: ImageTool, dirs = searchDirs): string | undefined {
  const known = found.get(tool);
  if (known) return known;
  for (const dir of dirs) {
    const candidate = join(dir, tool);
    try {
      accessSync(candidate, constants.X_OK);
      found.set(tool, candidate);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

/** The path of each tool named, or `AppError("internal")` saying what to install (a host without them cannot build). */
export function requireTools<T extends ImageTool>(tools: T[]): Record<T, string> {
  const out = {} as Record<T, string>;
  const missing: T[] = [];
  for (const t of tools) {
    const p = toolPath(t);
    if (p) out[t] = p;
    else missing.push(t);
  }
  if (missing.length > 0) {
    const pkgs = [...new Set(missing.map((t) => imageTools[t]))];
    throw new AppError("internal", `image builds need ${missing.join(", ")} on this host: install ${pkgs.join(" ")} (apt-get install -y ${pkgs.join(" ")})`);
  }
  return out;
}

export interface EnsureImageToolsOptions {
  log: (line: string) => void;
  /**
   * Installs Debian packages, true when it worked (scripts/setup-vm.ts's `aptInstall`). Called only as root; without
   * it, what is missing is only reported.
   */
  install?: (packages: string[]) => boolean;
  /** Whether this process may install (default: running as root). */
  isRoot?: boolean;
}

/** Checks for every image tool, installs the missing ones' packages when it can, and answers the tools still missing. */
export function ensureImageTools(opts: EnsureImageToolsOptions): { missing: string[] } {
  const tools = Object.keys(imageTools) as ImageTool[];
  const absent = () => tools.filter((t) => !toolPath(t));
  let missing = absent();
  if (missing.length === 0) return { missing: [] };
  const pkgs = [...new Set(missing.map((t) => imageTools[t]))];
  const root = opts.isRoot ?? process.getuid?.() === 0;
  if (opts.install && root) {
    opts.log(`image tools: installing ${pkgs.join(" ")} (missing: ${missing.join(", ")})`);
    opts.install(pkgs);
    missing = absent();
  }
  if (missing.length > 0)
    opts.log(`image tools: missing ${missing.join(", ")}: run \`sudo apt-get install -y ${[...new Set(missing.map((t) => imageTools[t]))].join(" ")}\``);
  return { missing };
}
