// The firecracker driver built from configuration: defaults, the jailer switch, and refusing a half-given jailer.
import { describe, expect, it } from "vitest";
import { createFirecrackerDriver, firecrackerBinary, firecrackerEnv } from "../../fleet-agent/drivers/firecracker/config.ts";
import { parseEnv } from "../../lib/env.ts";

const images = async () => ({ kernel: "/k" });
const spec = { vmId: "vm_x", agentId: "agt_x", image: "demo", vcpus: 1, memMiB: 128, allowEgress: false, stateDir: "/var/lib/agentvm/vms/vm_x" };

describe("firecracker driver configuration", () => {
  it("defaults: firecracker from PATH, no jailer (files in the stateDir)", () => {
    expect(firecrackerBinary({})).toBe("firecracker");
    const d = createFirecrackerDriver({ env: {}, dataDir: "/data", images });
    expect(d.paths(spec)).toMatchObject({ root: spec.stateDir, apiSock: `${spec.stateDir}/fc.sock`, marker: `${spec.stateDir}/fc.sock` });
  });

  it("FIRECRACKER_JAILER puts the VM's files into the chroot and marks the process by its --id", () => {
    const d = createFirecrackerDriver({
      env: { FIRECRACKER_BIN: "/opt/fc/firecracker", FIRECRACKER_JAILER: "/opt/fc/jailer", FIRECRACKER_JAILER_UID: "123", FIRECRACKER_JAILER_GID: "456" },
      dataDir: "/data",
      images,
    });
    const p = d.paths(spec);
    expect(p.root).toBe(`${spec.stateDir}/jail/firecracker/vm-x/root`);
    expect(p.vm(p.vsock)).toBe("/vsock.sock");
    expect(p.marker).toBe("vm-x");
  });

  it("a jailer without its uid/gid is a configuration error naming the variable", () => {
    expect(() => createFirecrackerDriver({ env: { FIRECRACKER_JAILER: "/opt/fc/jailer" }, dataDir: "/data", images })).toThrow(
      /FIRECRACKER_JAILER_UID is required/,
    );
    expect(() => createFirecrackerDriver({ env: { FIRECRACKER_DIFF: "maybe" }, dataDir: "/data", images })).toThrow(/FIRECRACKER_DIFF must be true or false/);
  });

  it("the fast paths are the defaults: templates on; diff snapshots where the data directory reflinks (FIRECRACKER_DIFF=auto), or as set", () => {
    const parsed = parseEnv(firecrackerEnv, {});
    expect(parsed).toMatchObject({ FIRECRACKER_TEMPLATES: true, FIRECRACKER_DIFF: "auto" });
    const diff = (env: Record<string, string>, reflink: boolean) =>
      (createFirecrackerDriver({ env, dataDir: "/data", images, reflink }) as unknown as { opts: { diffSnapshots: boolean } }).opts.diffSnapshots;
    expect([diff({}, true), diff({}, false)]).toEqual([true, false]);
    expect([diff({ FIRECRACKER_DIFF: "false" }, true), diff({ FIRECRACKER_DIFF: "true" }, false)]).toEqual([false, true]);
    expect(parseEnv(firecrackerEnv, { FIRECRACKER_TEMPLATES: "false" }).FIRECRACKER_TEMPLATES).toBe(false);
  });
});
