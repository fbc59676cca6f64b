// Absolute paths of the system tools tests call (e2fsprogs lives in /usr/sbin, which CI's PATH does not have).
import { accessSync, constants } from "node:fs";
import { join } from "node:path";

const dirs = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/** The tool's absolute path; throws naming the Debian package when it is nowhere. */
export function sbin(tool: string): string {
  for (const dir of dirs) {
    try {
      accessSync(join(dir, tool), constants.X_OK);
      return join(dir, tool);
    } catch {
      // not here
    }
  }
  throw new Error(`${tool} not found in ${dirs.join(":")} (apt-get install -y e2fsprogs)`);
}
