// The egress policy as a Firecracker tap's rules take it (fleet-agent/egress/direct-lists.ts): each kind of entry,
// IPv4 and IPv6, allow entries before every refusal, what cannot be carried reported, and entries that are no CIDR refused.
import { describe, expect, it } from "vitest";
import { directEgressLists } from "../../fleet-agent/egress/direct-lists.ts";
import { decide, parseRules, refusedV4Cidrs, type EgressRule } from "../../fleet-agent/egress/policy.ts";

const lists = (allow: string, deny: string) => directEgressLists({ allow: parseRules(allow), deny: parseRules(deny) });

describe("egress policy → a tap's allow and deny lists", () => {
  it("without operator entries: the proxy's default IPv4 refusals, and no IPv6 at all", () => {
    const l = lists("", "");
    expect(l.v4.allow).toEqual([]);
    expect(l.v4.deny).toEqual(refusedV4Cidrs());
    for (const cidr of ["10.0.0.0/8", "169.254.0.0/16", "127.0.0.0/8", "100.64.0.0/10", "240.0.0.0/4"]) expect(l.v4.deny).toContain(cidr);
    expect(l.v6).toEqual({ allow: [], deny: ["::/0"] });
    expect(l.notes).toEqual([]);
  });

  it("each kind of entry: an address, a CIDR (host bits cleared as the proxy ignores them), either with a port", () => {
    const l = lists("10.1.2.3, 10.20.0.0/16, 10.1.2.4:8080, 192.168.7.9/24:443", "203.0.114.7, 198.51.0.0/16:25, 8.8.8.8:53");
    expect(l.v4.allow).toEqual(["10.1.2.3/32", "10.20.0.0/16", "10.1.2.4/32:8080", "192.168.7.0/24:443"]);
    // The operator's refusals first, then the defaults; a public range the operator closes is in the list.
    expect(l.v4.deny.slice(0, 3)).toEqual(["203.0.114.7/32", "198.51.0.0/16:25", "8.8.8.8/32:53"]);
    expect(l.v4.deny.slice(3)).toEqual(refusedV4Cidrs());
  });

  it("an allow entry inside a refused range stays an exception, listed apart from the refusals the script drops after it", () => {
    // The proxy: an allow entry wins over EGRESS_DENY and over the default refusals.
    const rules = { allow: parseRules("10.9.0.0/16, 169.254.169.254:80, 8.8.8.8"), deny: parseRules("8.8.0.0/16") };
    expect(decide("10.9.8.7", 443, rules, []).allowed).toBe(true);
    expect(decide("169.254.169.254", 80, rules, []).allowed).toBe(true);
    expect(decide("169.254.169.254", 81, rules, []).allowed).toBe(false);
    expect(decide("8.8.8.8", 53, rules, []).allowed).toBe(true);
    expect(decide("8.8.4.4", 53, rules, []).allowed).toBe(false);
    const l = directEgressLists(rules);
    expect(l.v4.allow).toEqual(["10.9.0.0/16", "169.254.169.254/32:80", "8.8.8.8/32"]);
    for (const refused of ["8.8.0.0/16", "10.0.0.0/8", "169.254.0.0/16"]) expect(l.v4.deny).toContain(refused);
  });

  it("an entry another one of its list covers is left out (one rule per range)", () => {
    const l = lists("10.0.0.0/8, 10.1.0.0/16, 10.2.3.4:22, 10.0.0.0/8", "10.5.0.0/16, 172.16.1.0/24, 192.168.1.1:80");
    expect(l.v4.allow).toEqual(["10.0.0.0/8"]);
    expect(l.v4.deny).not.toContain("10.5.0.0/16");
    expect(l.v4.deny).not.toContain("172.16.1.0/24");
    expect(l.v4.deny).not.toContain("192.168.1.1/32:80");
    expect(l.v4.deny).toEqual(refusedV4Cidrs());
  });

  it("IPv6: every destination refused; IPv6 allow entries and loopback allow entries reported, as a Firecracker guest cannot use them", () => {
    const l = lists("[fd00::5]:443, 2001:db8::/32, 127.0.0.1:9000, 0.0.0.0/0", "fd00::/8, [2606:4700::1111]:53");
    expect(l.v6).toEqual({ allow: [], deny: ["::/0"] });
    // 127.0.0.1 is the guest's own loopback: no rule for it; 0.0.0.0/0 keeps its rule but its loopback part is reported too.
    expect(l.v4.allow).toEqual(["0.0.0.0/0"]);
    expect(l.notes).toHaveLength(4);
    expect(l.notes[0]).toMatch(/^EGRESS_ALLOW \[fd00::5\]:443 does not apply to Firecracker agents: their tap carries IPv4 only/);
    expect(l.notes[1]).toMatch(/^EGRESS_ALLOW 2001:db8::\/32 does not apply/);
    expect(l.notes[2]).toMatch(/^EGRESS_ALLOW 127\.0\.0\.1:9000: .*own loopback/);
    expect(l.notes[3]).toMatch(/^EGRESS_ALLOW 0\.0\.0\.0\/0: .*own loopback/);
    // IPv6 deny entries need no rule of their own (all of IPv6 is refused) and are not reported.
    expect(l.v4.deny).toEqual(refusedV4Cidrs());
  });

  it("refuses what is not an address or CIDR with a port 1..65535, naming the entry", () => {
    expect(() => lists("db.internal:5432", "")).toThrow('egress rule "db.internal:5432": not an IP address or CIDR');
    expect(() => lists("10.0.0.0/33", "")).toThrow('egress rule "10.0.0.0/33": prefix length must be 0..32');
    // Rules built by hand (not through parseRules) are checked too: the lists go to a script that runs as root.
    const bad = (rule: Partial<EgressRule>) => () => directEgressLists({ allow: [], deny: [{ net: [10, 0, 0, 0], bits: 8, text: "x", ...rule }] });
    expect(bad({ net: [10, 0, 0], text: "10.0.0" })).toThrow('egress rule "10.0.0": not an IP address or CIDR');
    expect(bad({ net: [10, 0, 0, 256], text: "10.0.0.256" })).toThrow("not an IP address or CIDR");
    expect(bad({ bits: 40, text: "10.0.0.0/40" })).toThrow('egress rule "10.0.0.0/40": prefix length must be 0..32');
    expect(bad({ bits: 1.5, text: "10.0.0.0/1.5" })).toThrow("prefix length must be 0..32");
    expect(bad({ port: 0, text: "10.0.0.0/8:0" })).toThrow('egress rule "10.0.0.0/8:0": port must be 1..65535');
    expect(bad({ port: 70000, text: "10.0.0.0/8:70000" })).toThrow("port must be 1..65535");
  });
});
