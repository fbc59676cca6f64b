// The node:fs side of the host's disk port, against a real temporary directory.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { nodeHostFs } from "../../fleet-agent/host-fs.ts";

let dir: string | undefined;
afterEach(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

describe("node host fs", () => {
  it("lists only the directories under the VMs dir, and none when it does not exist", () => {
    dir = mkdtempSync(join(tmpdir(), "agentvm-host-fs-"));
    const vms = join(dir, "vms");
    expect(nodeHostFs.vmDirs(vms)).toEqual([]);
    mkdirSync(join(vms, "agt_a"), { recursive: true });
    mkdirSync(join(vms, "agt_b"));
    writeFileSync(join(vms, "stray.txt"), "not a VM");
    expect(nodeHostFs.vmDirs(vms).sort()).toEqual(["agt_a", "agt_b"]);
    expect(nodeHostFs.hasStateDir(join(vms, "agt_a"))).toBe(true);
    expect(nodeHostFs.hasStateDir(join(vms, "agt_c"))).toBe(false);
  });
});
