// The qemu driver's network arguments: restrict=on for every VM, the guestfwd to the egress proxy only with egress
// (and a relay), snapshots comparing the hardware without the host-side network settings, the forwarded addresses
// (which decide whether a restored guest checks its neighbours), and the proxy's address
// reaching the guest (kernel command line for the demo, the launch spec for a built image).
import { describe, expect, it } from "vitest";
import { launchEnv } from "../../fleet-agent/drivers/common/launch-data.ts";
import type { VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { kernelCmdline, machineArgs, netdevArg, qemuArgs, TCG_TB_MIB, vmPaths } from "../../fleet-agent/drivers/qemu/args.ts";
import { forwardedAddresses, hardware } from "../../fleet-agent/drivers/qemu/snapshot.ts";

const spec = (allowEgress: boolean): VmSpec => ({
  vmId: "vm_a",
  agentId: "agt_a",
  image: "demo",
  vcpus: 1,
  memMiB: 256,
  allowEgress,
  stateDir: "/var/lib/agentvm/vms/agt_a",
});
const paths = vmPaths("/var/lib/agentvm/vms/agt_a");
const relay = "/tmp/agentvm-qemu-0/egress-relay-abc";

describe("netdev", () => {
  it("forwards a second host port to the exec server (guest port 1025); snapshots compare without either forward", () => {
    const a = netdevArg({ spec: spec(false), paths, hostPort: 4000, execPort: 4100, egressRelay: undefined });
    expect(a).toBe("user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4000-:8080,hostfwd=tcp:127.0.0.1:4100-:1025");
    const base = { spec: spec(false), paths, accel: "tcg" as const, hostPort: 4000, egressRelay: undefined };
    // Every QEMU start has its own exec port: a snapshot taken under one restores under another.
    expect(hardware(machineArgs({ ...base, execPort: 4100 }))).toEqual(hardware(machineArgs({ ...base, execPort: 4222 })));
    expect(hardware(machineArgs({ ...base, execPort: 4100 }))).toEqual(hardware(machineArgs(base)));
  });

  it("TCG's code cache size is the host's setting, not the guest's hardware: a snapshot restores under another", () => {
    const base = { spec: spec(false), paths, accel: "tcg" as const, hostPort: 4000, egressRelay: undefined };
    expect(machineArgs({ ...base, tcgTbMiB: 16 })).toContain("tcg,tb-size=16");
    expect(machineArgs(base)).toContain(`tcg,tb-size=${TCG_TB_MIB}`);
    expect(hardware(machineArgs({ ...base, tcgTbMiB: 16 }))).toEqual(hardware(machineArgs(base)));
  });

  it("is restrict=on with only the forwarded port when there is no relay, egress or not", () => {
    expect(netdevArg({ spec: spec(false), paths, hostPort: 4000, egressRelay: undefined })).toBe("user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4000-:8080");
    expect(netdevArg({ spec: spec(true), paths, hostPort: 4000, egressRelay: undefined })).toBe("user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4000-:8080");
  });

  it("without egress still gets the proxy's guestfwd: its upstreams are there (the proxy refuses anything else)", () => {
    expect(netdevArg({ spec: spec(false), paths, hostPort: 4000, egressRelay: relay })).toBe(
      `user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4000-:8080,guestfwd=tcp:10.0.2.100:3128-cmd:'${relay}' '/var/lib/agentvm/vms/agt_a/proxy.sock'`,
    );
  });

  it("with egress stays restrict=on and adds one guestfwd running the relay per connection to the VM's proxy socket", () => {
    expect(netdevArg({ spec: spec(true), paths, hostPort: 4000, egressRelay: relay })).toBe(
      `user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:4000-:8080,guestfwd=tcp:10.0.2.100:3128-cmd:'${relay}' '/var/lib/agentvm/vms/agt_a/proxy.sock'`,
    );
    // A comma in a path is doubled inside QEMU's option list.
    const odd = vmPaths("/srv/a,b");
    expect(netdevArg({ spec: { ...spec(true), stateDir: "/srv/a,b" }, paths: odd, hostPort: 1, egressRelay: relay })).toContain("'/srv/a,,b/proxy.sock'");
  });

  it("a snapshot's hardware does not depend on egress, the relay or the forwarded port", () => {
    const on = machineArgs({ spec: spec(true), paths, accel: "tcg", hostPort: 4000, egressRelay: relay });
    const off = machineArgs({ spec: spec(false), paths, accel: "tcg", hostPort: 4001 });
    const older = off.map((a) => a.replace("restrict=on", "restrict=off")); // what the driver recorded before for an agent with egress
    expect(on.join(" ")).not.toBe(off.join(" "));
    expect(hardware(on)).toEqual(hardware(off));
    expect(hardware(older)).toEqual(hardware(off));
    expect(hardware(on).join(" ")).toContain("user,id=net0 ");
    // Real hardware still counts.
    const bigger = machineArgs({ spec: { ...spec(true), memMiB: 512 }, paths, accel: "tcg", hostPort: 4000, egressRelay: relay });
    expect(hardware(bigger)).not.toEqual(hardware(on));
  });

  it("what the guest can reach beyond its gateway: the forwarded addresses, whatever the relay's path or the port", () => {
    const on = machineArgs({ spec: spec(true), paths, accel: "tcg", hostPort: 4000, egressRelay: relay });
    const elsewhere = machineArgs({ spec: spec(true), paths: vmPaths("/srv/other,dir"), accel: "tcg", hostPort: 4100, egressRelay: "/opt/relay" });
    const before = machineArgs({ spec: spec(false), paths, accel: "tcg", hostPort: 4000 }); // a snapshot of a VM without egress, before upstreams
    const off = machineArgs({ spec: spec(false), paths, accel: "tcg", hostPort: 4000, egressRelay: relay });
    expect(forwardedAddresses(on)).toEqual(["10.0.2.100:3128"]);
    expect(forwardedAddresses(elsewhere)).toEqual(forwardedAddresses(on)); // a restore there skips the neighbour check
    expect(forwardedAddresses(off)).toEqual(["10.0.2.100:3128"]); // every VM reaches its upstreams now
    expect(forwardedAddresses(before)).toEqual([]); // restored with the forward: the guest checks its neighbours
    expect(hardware(before)).toEqual(hardware(off)); // and the snapshot restores: the forward is no hardware
  });
});

describe("how the guest learns the proxy", () => {
  it("the demo guest: on the kernel command line, only with egress", () => {
    expect(kernelCmdline("kvm", undefined, true)).toContain("agentvm.egress_proxy=http://10.0.2.100:3128");
    expect(kernelCmdline("kvm", undefined, false)).not.toContain("egress");
    const launch = { spec: spec(true), paths, accel: "tcg" as const, hostPort: 1, kernel: "k", initrd: "i", tscKhz: undefined, incoming: false };
    expect(qemuArgs({ ...launch, egressRelay: relay }).join(" ")).toContain("agentvm.egress_proxy=");
    expect(qemuArgs(launch).join(" ")).not.toContain("agentvm.egress_proxy=");
  });

  it("a built image's entrypoint: HTTP_PROXY and friends in its environment, only with egress", () => {
    expect(launchEnv({ agentId: "agt_a", port: 8080, egressProxy: "http://10.0.2.100:3128" })).toEqual([
      "PORT=8080",
      "AGENT_ID=agt_a",
      "LEASE_DIR=/run/agentvm/leases",
      "HTTP_PROXY=http://10.0.2.100:3128",
      "HTTPS_PROXY=http://10.0.2.100:3128",
      "http_proxy=http://10.0.2.100:3128",
      "https_proxy=http://10.0.2.100:3128",
      "NO_PROXY=localhost,127.0.0.1,10.0.2.100",
      "no_proxy=localhost,127.0.0.1,10.0.2.100",
      "NODE_USE_ENV_PROXY=1",
    ]);
    expect(launchEnv({ agentId: "agt_a", port: 8080 }).some((e) => /proxy/i.test(e))).toBe(false);
  });

  it("every VM that reaches the proxy: AGENTVM_UPSTREAMS_URL and one variable per upstream it had at boot", () => {
    expect(launchEnv({ agentId: "agt_a", port: 8080, upstreams: ["openai", "my-model"] }).slice(3)).toEqual([
      "AGENTVM_UPSTREAMS_URL=http://10.0.2.100:3128/u",
      "AGENTVM_UPSTREAM_OPENAI_URL=http://10.0.2.100:3128/u/openai",
      "AGENTVM_UPSTREAM_MY_MODEL_URL=http://10.0.2.100:3128/u/my-model",
    ]);
    const launch = { spec: spec(false), paths, accel: "tcg" as const, hostPort: 1, kernel: "k", initrd: "i", tscKhz: undefined, incoming: false };
    expect(qemuArgs({ ...launch, egressRelay: relay, upstreams: ["openai", "b"] }).join(" ")).toContain("agentvm.upstreams=openai,b");
    expect(qemuArgs({ ...launch, egressRelay: relay }).join(" ")).toContain("agentvm.upstreams=");
    expect(qemuArgs({ ...launch, egressRelay: relay }).join(" ")).not.toContain("agentvm.egress_proxy=");
    expect(qemuArgs(launch).join(" ")).not.toContain("agentvm.upstreams");
  });
});
