// Per-VM networking of the firecracker driver: slot → tap/addresses/MAC, exclusive slot claims that survive
// hibernation, the kernel ip= argument, and the rules scripts/setup-firecracker-net.sh would apply (DRY_RUN).
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { claimNet, DEFAULT_NET_CIDR, kernelIpArg, maxSlots, netScriptArgs, releaseNet, slotNet } from "../../fleet-agent/drivers/firecracker/net.ts";

const root = mkdtempSync(join(tmpdir(), "fcn-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

function stateDir(name: string): string {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  return dir;
}

describe("firecracker VM networking", () => {
  it("cuts the range into /30s: host .1, guest .2 of each, one tap and MAC per slot", () => {
    expect(slotNet("172.30.0.0/16", 0)).toEqual({ slot: 0, tap: "fcvm0", hostIp: "172.30.0.1", guestIp: "172.30.0.2", prefix: 30, mac: "06:00:00:00:00:00" });
    expect(slotNet("172.30.0.0/16", 300)).toMatchObject({ tap: "fcvm300", hostIp: "172.30.4.177", guestIp: "172.30.4.178", mac: "06:00:00:00:01:2c" });
    expect(maxSlots("172.30.0.0/16")).toBe(16384);
    expect(() => slotNet("172.30.0.0/16", 16384)).toThrow(/outside/);
    expect(kernelIpArg(slotNet("172.30.0.0/16", 1))).toBe("ip=172.30.0.6::172.30.0.5:255.255.255.252::eth0:off");
  });

  it("claims are exclusive, kept by the VM across calls, and freed on release", async () => {
    const net = { slotsDir: join(root, "slots"), cidr: "10.9.0.0/29" }; // two slots only
    const [a, b] = await Promise.all([claimNet(net, stateDir("a"), "vm_a"), claimNet(net, stateDir("b"), "vm_b")]);
    expect(new Set([a.slot, b.slot])).toEqual(new Set([0, 1]));
    expect(await claimNet(net, stateDir("a"), "vm_a")).toEqual(a); // the same VM keeps its tap and address
    await expect(claimNet(net, stateDir("c"), "vm_c")).rejects.toThrow(/no free network slot in 10\.9\.0\.0\/29/);
    await releaseNet(net, stateDir("a"), "vm_a");
    expect((await claimNet(net, stateDir("c"), "vm_c")).slot).toBe(a.slot);
  });

  it("setup script: egress denied unless allowed; the guest reaches no host service; ingress mapping optional", () => {
    const script = join(import.meta.dirname, "../../scripts/setup-firecracker-net.sh");
    const dry = (...args: string[]) =>
      execFileSync("bash", [script, ...args], { env: { ...process.env, DRY_RUN: "1" }, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    const denied = dry("up", "--tap", "fcvm3", "--host-ip", "172.30.0.13", "--guest-ip", "172.30.0.14");
    expect(denied).toContain("+ ip tuntap add dev fcvm3 mode tap");
    expect(denied).toContain("+ ip addr replace 172.30.0.13/30 dev fcvm3");
    expect(denied).toMatch(/chain input \{[^}]*iifname "fcvm3" ct state established,related accept\n\s*iifname "fcvm3" drop/);
    expect(denied).toMatch(/chain forward \{[^}]*iifname "fcvm3" drop/);
    expect(denied).not.toContain("masquerade");
    expect(denied).not.toMatch(/iifname "fcvm3" oifname .* accept/);

    const allowed = dry(
      "up",
      "--tap",
      "fcvm3",
      "--host-ip",
      "172.30.0.13",
      "--guest-ip",
      "172.30.0.14",
      "--allow-egress",
      "--uplink",
      "eth0",
      "--host-port",
      "18080",
    );
    expect(allowed).toContain('iifname "fcvm3" oifname "eth0" accept');
    expect(allowed).toContain('ip saddr 172.30.0.14 oifname "eth0" masquerade');
    expect(allowed).toContain("tcp dport 18080 dnat ip to 172.30.0.14:8080");
    expect(allowed).toContain("+ sysctl -q -w net.ipv4.ip_forward=1");

    // What the driver passes where egress is allowed: the proxy's refusals as a drop before the accept.
    const net = slotNet(DEFAULT_NET_CIDR, 3);
    const driverArgs = netScriptArgs("up", net, { allowEgress: true, uplink: "eth0" });
    expect(driverArgs).toContain("--deny");
    const fromDriver = dry(...driverArgs);
    const drop = fromDriver.indexOf(`iifname "${net.tap}" ip daddr { `);
    expect(drop).toBeGreaterThan(0);
    expect(drop).toBeLessThan(fromDriver.indexOf(`iifname "${net.tap}" oifname "eth0" accept`));
    for (const cidr of ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "127.0.0.0/8", "100.64.0.0/10"]) expect(fromDriver).toContain(cidr);
    expect(netScriptArgs("up", net, { allowEgress: false })).not.toContain("--deny");
    expect(() =>
      dry("up", "--tap", "fcvm3", "--host-ip", "172.30.0.13", "--guest-ip", "172.30.0.14", "--allow-egress", "--deny", "10.0.0.0/8; rm -rf /"),
    ).toThrow(/--deny takes/);

    expect(dry("down", "--tap", "fcvm3")).toBe("+ nft delete table inet agentvm_fcvm3\n+ ip link del dev fcvm3\n");
    expect(() => dry("up", "--tap", "bad name")).toThrow(/--tap must be/);
  });
});
