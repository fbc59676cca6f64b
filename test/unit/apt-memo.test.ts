// apt's answer on the guest kernel package is kept while apt's state (its lists, dpkg's status, sources, pinning) is unchanged, and read again when it changes.
import { describe, expect, it } from "vitest";
import { mkdtempSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { aptState, rememberWhileAptUnchanged } from "../../fleet-agent/guest/apt-memo.ts";

describe("rememberWhileAptUnchanged", () => {
  it("computes once per apt state; a changed state or an unreadable file computes again", () => {
    const dir = mkdtempSync(join(tmpdir(), "agentvm-aptmemo-"));
    try {
      const file = join(dir, "images", "demo", ".kernel-package.json");
      let calls = 0;
      let state = "lists@1";
      const compute = () => ({ pkg: "linux-image-x", version: `v${++calls}` });
      expect(rememberWhileAptUnchanged(file, compute, () => state)).toEqual({ pkg: "linux-image-x", version: "v1" });
      expect(rememberWhileAptUnchanged(file, compute, () => state)).toEqual({ pkg: "linux-image-x", version: "v1" });
      expect(calls).toBe(1);
      state = "lists@2"; // apt-get update ran
      expect(rememberWhileAptUnchanged(file, compute, () => state).version).toBe("v2");
      writeFileSync(file, "{not json");
      expect(rememberWhileAptUnchanged(file, compute, () => state).version).toBe("v3");
      expect(calls).toBe(3);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("apt's state is the paths' modification times: touching one changes it, a missing one counts", () => {
    const dir = mkdtempSync(join(tmpdir(), "agentvm-aptmemo-"));
    try {
      const status = join(dir, "status");
      writeFileSync(status, "");
      utimesSync(status, 1000, 1000);
      const paths = [status, join(dir, "lists"), join(dir, "absent")];
      const before = aptState(paths);
      expect(aptState(paths)).toBe(before);
      utimesSync(status, 2000, 2000);
      expect(aptState(paths)).not.toBe(before);
      expect(before).toContain(`${join(dir, "absent")}@-`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
