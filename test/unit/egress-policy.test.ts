// The egress address policy: every special range (IPv4, IPv6, IPv4 inside IPv6, the edges of each), the allow and
// deny entries, the host's own addresses; the configuration that carries them.
import { describe, expect, it } from "vitest";
import { parseEgressConfig } from "../../fleet-agent/egress/config.ts";
import { classifyAddress, decide, parseAddress, parseRule, parseRules, type EgressRules } from "../../fleet-agent/egress/policy.ts";

const none: EgressRules = { allow: [], deny: [] };

describe("classifyAddress", () => {
  it.each([
    ["127.0.0.1", "loopback"],
    ["127.255.255.255", "loopback"],
    ["126.255.255.255", "public"],
    ["128.0.0.0", "public"],
    ["0.0.0.0", "unspecified"],
    ["0.255.255.255", "unspecified"],
    ["1.0.0.0", "public"],
    ["10.0.0.0", "private"],
    ["10.255.255.255", "private"],
    ["11.0.0.0", "public"],
    ["9.255.255.255", "public"],
    ["172.15.255.255", "public"],
    ["172.16.0.0", "private"],
    ["172.31.255.255", "private"],
    ["172.32.0.0", "public"],
    ["192.167.255.255", "public"],
    ["192.168.0.1", "private"],
    ["192.169.0.0", "public"],
    ["169.254.169.254", "link-local"],
    ["169.254.0.0", "link-local"],
    ["169.253.255.255", "public"],
    ["169.255.0.0", "public"],
    ["100.63.255.255", "public"],
    ["100.64.0.0", "shared (CGNAT)"],
    ["100.127.255.255", "shared (CGNAT)"],
    ["100.128.0.0", "public"],
    ["224.0.0.1", "multicast"],
    ["239.255.255.255", "multicast"],
    ["223.255.255.255", "public"],
    ["240.0.0.1", "reserved"],
    ["255.255.255.255", "reserved"],
    ["192.0.0.170", "reserved"],
    ["198.18.0.1", "reserved"],
    ["198.19.255.255", "reserved"],
    ["198.20.0.0", "public"],
    ["192.0.2.2", "documentation"],
    ["8.8.8.8", "public"],
    // IPv6
    ["::1", "loopback"],
    ["0:0:0:0:0:0:0:1", "loopback"],
    ["::", "unspecified"],
    ["fe80::1", "link-local"],
    ["fe80::1%eth0", "link-local"],
    ["febf:ffff::1", "link-local"],
    ["fec0::1", "private"],
    ["fc00::1", "private"],
    ["fd12:3456::1", "private"],
    ["fbff:ffff::1", "public"],
    ["ff02::1", "multicast"],
    ["2001:db8::1", "documentation"],
    ["100::1", "reserved"],
    ["2606:4700:4700::1111", "public"],
    ["2a00:1450:4001::200e", "public"],
    // IPv4 inside IPv6: judged by the IPv4 address
    ["::ffff:127.0.0.1", "loopback"],
    ["::ffff:7f00:1", "loopback"],
    ["::ffff:169.254.169.254", "link-local"],
    ["::ffff:10.1.2.3", "private"],
    ["::ffff:8.8.8.8", "public"],
    ["::ffff:0.0.0.0", "unspecified"],
    ["::127.0.0.1", "loopback"],
    ["64:ff9b::a9fe:a9fe", "link-local"],
    ["64:ff9b::808:808", "public"],
    ["2002:7f00:0001::1", "loopback"],
    ["2002:0808:0808::1", "public"],
  ])("%s is %s", (address, cls) => {
    expect(classifyAddress(address)).toBe(cls);
  });

  it("parses text forms to the same bytes and refuses non-addresses", () => {
    expect(parseAddress("::ffff:127.0.0.1")).toEqual(parseAddress("::ffff:7f00:0001"));
    expect(parseAddress("1::")).toEqual([0, 1, ...Array(14).fill(0)]);
    expect(parseAddress("fe80::1%lo")).toEqual(parseAddress("fe80::1"));
    for (const bad of ["", "localhost", "1.2.3", "256.1.1.1", "1.2.3.4.5", "::g", "1:2:3:4:5:6:7:8:9", "01.2.3.4x"]) expect(parseAddress(bad)).toBeUndefined();
    expect(() => classifyAddress("example.com")).toThrow(/not an IP address/);
  });
});

describe("decide", () => {
  it("refuses every non-public class and the host's own addresses; allows public ones", () => {
    expect(decide("127.0.0.1", 80, none, [])).toEqual({ allowed: false, why: "127.0.0.1 is a loopback address" });
    expect(decide("169.254.169.254", 80, none, [])).toEqual({ allowed: false, why: "169.254.169.254 is a link-local address" });
    expect(decide("0.0.0.0", 80, none, []).allowed).toBe(false);
    expect(decide("::ffff:127.0.0.1", 80, none, []).allowed).toBe(false);
    expect(decide("8.8.8.8", 53, none, [])).toEqual({ allowed: true, why: "public address" });
    // A public address that is the host's own (its public interface) is refused; as IPv4-mapped IPv6 too.
    expect(decide("203.1.113.9", 22, none, ["127.0.0.1", "203.1.113.9"])).toEqual({ allowed: false, why: "203.1.113.9 is an address of this host" });
    expect(decide("::ffff:203.1.113.9", 22, none, ["203.1.113.9"]).allowed).toBe(false);
    expect(decide("2a01:4f8::5", 22, none, ["2a01:4f8:0:0::5"]).allowed).toBe(false);
    expect(decide("2a01:4f8::6", 22, none, ["2a01:4f8::5"]).allowed).toBe(true);
    expect(decide("not-an-ip", 80, none, []).allowed).toBe(false);
  });

  it("an allow entry wins (over a class, the host's addresses and a deny entry); one with a port allows that port only", () => {
    const rules: EgressRules = { allow: parseRules("127.0.0.1:4555, 10.20.0.0/16"), deny: parseRules("10.20.0.0/16") };
    expect(decide("127.0.0.1", 4555, rules, ["127.0.0.1"])).toEqual({ allowed: true, why: "allowed by 127.0.0.1:4555" });
    expect(decide("127.0.0.1", 4556, rules, ["127.0.0.1"]).allowed).toBe(false);
    expect(decide("::ffff:127.0.0.1", 4555, rules, []).allowed).toBe(true);
    expect(decide("10.20.3.4", 1, rules, []).allowed).toBe(true);
    expect(decide("10.21.0.1", 1, rules, []).allowed).toBe(false);
  });

  it("a deny entry closes a public range", () => {
    const rules: EgressRules = { allow: [], deny: parseRules("8.8.8.0/24 [2606:4700::/32]:443") };
    expect(decide("8.8.8.8", 53, rules, [])).toEqual({ allowed: false, why: "denied by 8.8.8.0/24" });
    expect(decide("8.8.9.8", 53, rules, []).allowed).toBe(true);
    expect(decide("2606:4700::1", 443, rules, []).allowed).toBe(false);
    expect(decide("2606:4700::1", 80, rules, []).allowed).toBe(true);
  });
});

describe("rules and configuration", () => {
  it("parses each entry form and refuses bad ones", () => {
    expect(parseRule("10.1.2.3:8080")).toMatchObject({ net: [10, 1, 2, 3], bits: 32, port: 8080 });
    expect(parseRule("10.0.0.0/8")).toMatchObject({ bits: 8 });
    expect(parseRule("10.0.0.0/8").port).toBeUndefined();
    expect(parseRule("10.0.0.0/8:443")).toMatchObject({ bits: 8, port: 443 });
    expect(parseRule("[fd00::5]:443")).toMatchObject({ bits: 128, port: 443 });
    expect(parseRule("fd00::/8")).toMatchObject({ bits: 8 });
    expect(parseRule("[fd00::/8]:22")).toMatchObject({ bits: 8, port: 22 });
    for (const bad of ["example.com", "10.0.0.0/33", "10.1.2.3:0", "10.1.2.3:65536", "[fd00::1]:x", "fd00::/129", "10.0.0.0/x"])
      expect(() => parseRule(bad), bad).toThrow(/egress rule/);
    expect(parseRules(" ")).toEqual([]);
  });

  it("EGRESS_* are parsed once with documented defaults; a bad entry fails the start naming the variable", () => {
    const c = parseEgressConfig({});
    expect(c).toEqual({
      rules: { allow: [], deny: [] },
      connectTimeoutMs: 10_000,
      idleTimeoutMs: 600_000,
      maxConnectionsPerVm: 256,
      upstreams: {
        timeoutMs: 600_000,
        maxBodyBytes: 32 * 1024 * 1024,
        keepBodyBytes: 1024 * 1024,
        cacheMs: 5000,
        async: { deadlineMs: 3_600_000, maxAttempts: 5, concurrency: 16 },
      },
    });
    const d = parseEgressConfig({ EGRESS_ALLOW: "127.0.0.1:9000", EGRESS_DENY: "1.2.3.4", EGRESS_MAX_CONNECTIONS: "3" });
    expect(d.rules.allow.map((r) => r.text)).toEqual(["127.0.0.1:9000"]);
    expect(d.rules.deny.map((r) => r.text)).toEqual(["1.2.3.4"]);
    expect(d.maxConnectionsPerVm).toBe(3);
    expect(() => parseEgressConfig({ EGRESS_ALLOW: "nope" })).toThrow(/EGRESS_ALLOW/);
  });
});
