// Per-VM networking of the firecracker driver: slot → tap/addresses/MAC, exclusive slot claims that survive
// hibernation, the kernel ip= argument, and the rules scripts/setup-firecracker-net.sh would apply (DRY_RUN), checked
// by `nft -c` (check mode: nothing is applied) where nft runs.
import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { claimNet, DEFAULT_NET_CIDR, kernelIpArg, maxSlots, netScriptArgs, releaseNet, slotNet } from "../../fleet-agent/drivers/firecracker/net.ts";
import { prepareNet } from "../../fleet-agent/drivers/firecracker/boot.ts";
import { firecrackerEnv, firecrackerNetwork, NET_SETUP_SCRIPT } from "../../fleet-agent/drivers/firecracker/config.ts";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { directEgressLists } from "../../fleet-agent/egress/direct-lists.ts";
import { parseRules } from "../../fleet-agent/egress/policy.ts";
import { parseEnv } from "../../lib/env.ts";
import { createLogger } from "../../lib/log.ts";

const root = mkdtempSync(join(tmpdir(), "fcn-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const script = join(import.meta.dirname, "../../scripts/setup-firecracker-net.sh");
const dry = (...args: string[]) =>
  execFileSync("bash", [script, ...args], { env: { ...process.env, DRY_RUN: "1" }, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
/** The nftables ruleset in a DRY_RUN's output. */
const rulesetOf = (out: string) => /\+ nft -f - <<EOF\n([\s\S]*?)\nEOF\n/.exec(out)?.[1] ?? "";
/** Why `nft -c` cannot check a ruleset here (it needs nft and root, for netlink), or undefined. */
const nftUnavailable =
  process.getuid?.() !== 0 ? "not root" : spawnSync("nft", ["--version"]).status !== 0 ? "nft is missing (apt-get install nftables)" : undefined;
if (nftUnavailable && process.env.CI !== "true") console.log(`firecracker-net: nft -c of the tap rules skipped: ${nftUnavailable}`);

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
    ).toThrow(/--deny "10\.0\.0\.0\/8; rm -rf \/": not a CIDR/);

    expect(dry("down", "--tap", "fcvm3")).toBe("+ nft delete table inet agentvm_fcvm3\n+ ip link del dev fcvm3\n");
    expect(() => dry("up", "--tap", "bad name")).toThrow(/--tap must be/);
  });
  // The operator's EGRESS_ALLOW inside refused ranges and EGRESS_DENY on top, as the driver passes them.
  const net = slotNet(DEFAULT_NET_CIDR, 3);
  const egress = directEgressLists({
    allow: parseRules("10.9.0.0/16, 169.254.169.254:80, [fd00::5]:443"),
    deny: parseRules("203.0.114.0/24, 8.8.8.8:53, fd00::/8"),
  });
  const driverArgs = () => netScriptArgs("up", net, { allowEgress: true, uplink: "eth0", egress });

  it("setup script: the operator's allow entries are accepted before every drop, then its denies and the defaults, then IPv6 refused, then egress", () => {
    const args = driverArgs();
    expect(args.slice(args.indexOf("--allow"), args.indexOf("--allow") + 2)).toEqual(["--allow", "10.9.0.0/16,169.254.169.254/32:80"]);
    const out = dry(...args);
    const forward = /chain forward \{([^}]*(\{[^}]*\}[^}]*)*)\n {2}\}/.exec(out)?.[1] ?? "";
    const at = (line: string) => {
      const i = forward.indexOf(`\n    iifname "fcvm3" ${line}\n`);
      expect(i, line).toBeGreaterThan(0);
      return i;
    };
    const order = [
      at("ip daddr { 10.9.0.0/16 } accept"),
      at("ip daddr 169.254.169.254/32 meta l4proto { tcp, udp } th dport 80 accept"),
      at("ip daddr 8.8.8.8/32 meta l4proto { tcp, udp } th dport 53 drop"),
      at(
        "ip daddr { 203.0.114.0/24, 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.0.0.0/24, 192.0.2.0/24, 192.168.0.0/16, 198.18.0.0/15, 198.51.100.0/24, 203.0.113.0/24, 224.0.0.0/4, 240.0.0.0/4 } drop",
      ),
      at("ip6 daddr { ::/0 } drop"),
      at('oifname "eth0" accept'),
      at("drop"),
    ];
    expect([...order].sort((a, b) => a - b)).toEqual(order);
    // An allow entry may name one of the host's own addresses (the proxy connects to it): the input chain accepts
    // the same entries before its drop, and nothing else new.
    expect(out).toMatch(
      /chain input \{[^}]*ct state established,related accept\n\s*iifname "fcvm3" ip daddr \{ 10\.9\.0\.0\/16 \} accept\n\s*iifname "fcvm3" ip daddr 169\.254\.169\.254\/32 meta l4proto \{ tcp, udp \} th dport 80 accept\n\s*iifname "fcvm3" drop/,
    );
    // An allowed internal range may be routed out of another interface than the uplink: masqueraded there too.
    expect(out).toContain('ip saddr 172.30.0.14 ip daddr { 10.9.0.0/16, 169.254.169.254/32 } oifname != "fcvm3" masquerade');
    // Without egress none of it: the guest reaches nothing, allow entries included.
    const closed = dry(...netScriptArgs("up", net, { allowEgress: false, egress }));
    expect(closed).not.toContain("10.9.0.0/16");
    expect(closed).not.toContain("ip6 daddr");
    // Where nobody configured a policy, IPv6 is refused all the same.
    expect(dry(...netScriptArgs("up", net, { allowEgress: true }))).toContain('iifname "fcvm3" ip6 daddr { ::/0 } drop');
  });

  it("setup script: refuses --allow / --deny entries that are not CIDRs, IPv6 exceptions and malformed other arguments (it runs as root)", () => {
    const up =
      (...extra: string[]) =>
      () =>
        dry("up", "--tap", "fcvm3", "--host-ip", "172.30.0.13", "--guest-ip", "172.30.0.14", "--allow-egress", ...extra);
    expect(up("--allow", "10.0.0.0")).toThrow(/--allow "10\.0\.0\.0": not an IPv4 CIDR/);
    expect(up("--allow", "10.0.0.0/8,db.internal/32")).toThrow(/--allow "db\.internal\/32": not an IPv4 CIDR/);
    expect(up("--allow", "256.0.0.0/8")).toThrow(/not an IPv4 CIDR/);
    expect(up("--allow", "10.0.0.0/33")).toThrow(/not an IPv4 CIDR/);
    expect(up("--allow", "fd00::/8")).toThrow(/--allow "fd00::\/8": not an IPv4 CIDR .*no IPv6/);
    expect(up("--allow", "10.0.0.0/8:0")).toThrow(/--allow "10\.0\.0\.0\/8:0": port must be 1\.\.65535/);
    expect(up("--allow", "10.0.0.0/8:65536")).toThrow(/port must be 1\.\.65535/);
    expect(up("--deny", "10.0.0.0/8,$(reboot)/8")).toThrow(/--deny "\$\(reboot\)\/8": not a CIDR/);
    expect(up("--deny", "10.0.0.0/8 } accept; {")).toThrow(/not a CIDR/);
    expect(up("--deny", "fd00::/129")).toThrow(/--deny "fd00::\/129": not a CIDR/);
    expect(up("--deny", "1::2::3/64")).toThrow(/not a CIDR/);
    expect(up("--deny", "fd00::5/128:443")).toThrow(/not a CIDR/);
    expect(up("--deny", "10.0.0.0/8\n; flush ruleset")).toThrow(/one line each/);
    // The other values land in the ruleset or an ip command as well.
    expect(up("--uplink", 'eth0" accept')).toThrow(/--uplink must be an interface name/);
    expect(up("--host-port", "80 accept")).toThrow(/--host-port and --guest-port must be 1\.\.65535/);
    expect(up("--host-port", "18080", "--guest-port", "0")).toThrow(/--host-port and --guest-port must be 1\.\.65535/);
    expect(up("--prefix", "30 dev lo")).toThrow(/--prefix must be 0\.\.32/);
    expect(up("--owner", "root; id")).toThrow(/--owner must be a user name or id/);
    expect(() => dry("up", "--tap", "fcvm3", "--host-ip", "172.30.0.13", "--guest-ip", "172.30.0.300")).toThrow(/--guest-ip are required IPv4 addresses/);
    // IPv6 in --deny: a set of its own and a rule per port.
    const v6 = up("--deny", "fd00::/8,[2001:db8::1/128]:443")();
    expect(v6).toContain('iifname "fcvm3" ip6 daddr 2001:db8::1/128 meta l4proto { tcp, udp } th dport 443 drop');
    expect(v6).toContain('iifname "fcvm3" ip6 daddr { fd00::/8 } drop');
    expect(v6).not.toMatch(/ ip daddr \{/);
  });

  it.skipIf(nftUnavailable !== undefined && process.env.CI !== "true")(
    "setup script: nft parses the ruleset the driver asks for (nft -c: check only, nothing applied)",
    () => {
      const dir = mkdtempSync(join(root, "nft-"));
      const cases = {
        policy: driverArgs(),
        defaults: netScriptArgs("up", net, { allowEgress: true }),
        closed: [...netScriptArgs("up", net, { allowEgress: false }), "--host-port", "18080"],
        v6ports: [...netScriptArgs("up", net, { allowEgress: true }), "--deny", "[2001:db8::1/128]:443"],
      };
      for (const [name, args] of Object.entries(cases)) {
        const file = join(dir, `${name}.nft`);
        writeFileSync(file, `${rulesetOf(dry(...args))}\n`);
        const check = spawnSync("nft", ["-c", "-f", file], { encoding: "utf8" });
        expect(check.stderr, name).toBe("");
        expect(check.status, name).toBe(0);
      }
    },
  );
  it("at the driver's edge: EGRESS_ALLOW / EGRESS_DENY reach every VM's tap script; what a tap cannot carry is logged once", async () => {
    const lines: string[] = [];
    const logger = createLogger({ write: (line) => lines.push(line) });
    const settings = parseEnv(firecrackerEnv, {});
    const { rules } = parseEgressConfig({ EGRESS_ALLOW: "10.9.0.0/16, [fd00::5]:443", EGRESS_DENY: "203.0.114.0/24" });
    const network = firecrackerNetwork(settings, { dataDir: stateDir("edge"), egressRules: rules, logger });
    expect(network.setupScript).toBe(NET_SETUP_SCRIPT);
    // A recording stand-in for the script (the real one would make taps): two VMs booted with egress.
    const calls = join(root, "edge-net.log");
    const recorder = join(root, "edge-net.sh");
    writeFileSync(recorder, `#!/bin/sh\necho "$*" >> '${calls}'\n`);
    chmodSync(recorder, 0o755);
    for (const vmId of ["vm_e1", "vm_e2"]) await prepareNet({ ...network, setupScript: recorder }, { vmId, stateDir: stateDir(vmId), allowEgress: true });
    const recorded = readFileSync(calls, "utf8").trim().split("\n");
    expect(recorded).toHaveLength(2);
    for (const args of recorded) {
      expect(args).toContain("--allow-egress --allow 10.9.0.0/16 --deny 203.0.114.0/24,0.0.0.0/8,");
      expect(args).toMatch(/,240\.0\.0\.0\/4,::\/0$/);
    }
    const warnings = lines.map((l) => JSON.parse(l) as { level: string; msg: string }).filter((e) => e.level === "warn");
    expect(warnings.map((w) => w.msg)).toEqual([expect.stringMatching(/^EGRESS_ALLOW \[fd00::5\]:443 does not apply to Firecracker agents/)]);
    // An entry that is no CIDR refuses the driver at start, before any VM.
    const bad = { allow: [{ net: [10, 0, 0], bits: 8, text: "10.0.0" }], deny: [] };
    expect(() => firecrackerNetwork(settings, { dataDir: stateDir("edge-bad"), egressRules: bad })).toThrow('egress rule "10.0.0": not an IP address or CIDR');
  });
});
