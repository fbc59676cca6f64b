// The egress policy (policy.ts: the default refusals and the operator's EGRESS_ALLOW / EGRESS_DENY) as the lists a
// packet filter needs where a guest reaches out directly rather than through the proxy: a Firecracker VM's tap, whose
// nftables rules scripts/setup-firecracker-net.sh writes (drivers/firecracker/net.ts passes these lists to it).
//
// The proxy's order is kept by the order of the rules: every allow entry is accepted before anything is dropped (an
// allow entry wins over every refusal), then deny entries and the default refused ranges are dropped, then the rest
// goes out. Host names are not entries anywhere (parseRule refuses them), so every entry is an address or a CIDR.
//
// IPv6: a Firecracker guest is given an IPv4 address only (the kernel's `ip=` argument) and the host NATs only IPv4 for
// it, so its tap carries no IPv6 egress the proxy would allow: every IPv6 destination is refused (`::/0`), and an
// IPv6 allow entry cannot be honoured (it is reported in `notes`).
import { refusedV4Cidrs, type EgressRule, type EgressRules } from "./policy.ts";

/** An entry as the setup script takes it: `a.b.c.d/n`, or `a.b.c.d/n:port` (TCP and UDP to that port only). */
type ScriptEntry = string;

export interface DirectEgressLists {
  v4: {
    /** Accepted before any drop: the operator's EGRESS_ALLOW. */
    allow: ScriptEntry[];
    /** Dropped after the allows: the operator's EGRESS_DENY, then the default refused ranges. */
    deny: ScriptEntry[];
  };
  v6: {
    /** Always empty: a guest has no IPv6 address for an exception to come from. */
    allow: ScriptEntry[];
    /** `::/0`: no IPv6 egress at all. */
    deny: ScriptEntry[];
  };
  /** One line per operator entry these rules cannot enforce as the proxy does; the driver logs them once at start. */
  notes: string[];
}

const LOOPBACK_V4: EgressRule = { net: [127, 0, 0, 0], bits: 8, text: "127.0.0.0/8" };

/**
 * The lists for `rules` (parsed by policy.ts parseRules). Throws, naming the entry, on one that is not an address or
 * CIDR with an optional port 1..65535: the lists go to a script that runs as root.
 */
export function directEgressLists(rules: EgressRules): DirectEgressLists {
  const notes: string[] = [];
  const allow: EgressRule[] = [];
  for (const rule of rules.allow.map(checked)) {
    if (rule.net.length === 16) {
      notes.push(`EGRESS_ALLOW ${rule.text} does not apply to Firecracker agents: their tap carries IPv4 only, and every IPv6 destination is refused to them`);
      continue;
    }
    if (overlaps(rule, LOOPBACK_V4)) {
      // A guest's 127/8 is its own loopback: such packets never reach the host, so the host's loopback (which the
      // proxy would connect to) stays out of reach.
      notes.push(`EGRESS_ALLOW ${rule.text}: a Firecracker agent's 127.0.0.0/8 is its own loopback; the host's loopback stays out of its reach`);
      if (contains(LOOPBACK_V4, rule)) continue;
    }
    allow.push(rule);
  }
  const deny = [...rules.deny.map(checked).filter((r) => r.net.length === 4), ...refusedV4Cidrs().map(cidrRule)];
  return {
    v4: { allow: withoutCovered(allow).map(entryText), deny: withoutCovered(deny).map(entryText) },
    v6: { allow: [], deny: ["::/0"] },
    notes,
  };
}

/** The rule itself, or an error naming it when it is not one the script may be given. */
function checked(rule: EgressRule): EgressRule {
  const max = rule.net.length * 8;
  const what = (why: string) => new Error(`egress rule "${rule.text}": ${why}`);
  if ((rule.net.length !== 4 && rule.net.length !== 16) || !rule.net.every((b) => Number.isInteger(b) && b >= 0 && b <= 255))
    throw what("not an IP address or CIDR");
  if (!Number.isInteger(rule.bits) || rule.bits < 0 || rule.bits > max) throw what(`prefix length must be 0..${max}`);
  if (rule.port !== undefined && !(Number.isInteger(rule.port) && rule.port >= 1 && rule.port <= 65535)) throw what("port must be 1..65535");
  return rule;
}

function cidrRule(cidr: string): EgressRule {
  const [net, bits] = cidr.split("/");
  return { net: net!.split(".").map(Number), bits: Number(bits), text: cidr };
}

/** The network address with its host bits cleared (the proxy compares the first `bits` bits only), as `a.b.c.d/n[:port]`. */
function entryText(rule: EgressRule): ScriptEntry {
  const masked = rule.net.map((byte, i) => {
    const keep = Math.max(0, Math.min(8, rule.bits - i * 8));
    return byte & ((0xff << (8 - keep)) & 0xff);
  });
  return `${masked.join(".")}/${rule.bits}${rule.port !== undefined ? `:${rule.port}` : ""}`;
}

function bit(net: number[], i: number): number {
  return ((net[i >> 3] ?? 0) >> (7 - (i & 7))) & 1;
}

/** Does `outer` match every address and port `inner` matches? */
function contains(outer: EgressRule, inner: EgressRule): boolean {
  if (outer.net.length !== inner.net.length || outer.bits > inner.bits) return false;
  if (outer.port !== undefined && outer.port !== inner.port) return false;
  for (let i = 0; i < outer.bits; i++) if (bit(outer.net, i) !== bit(inner.net, i)) return false;
  return true;
}

/** Is there an address both match? */
function overlaps(a: EgressRule, b: EgressRule): boolean {
  if (a.net.length !== b.net.length) return false;
  for (let i = 0; i < Math.min(a.bits, b.bits); i++) if (bit(a.net, i) !== bit(b.net, i)) return false;
  return true;
}

/** One rule per range: an entry another entry of the same list already covers is left out (and so is a repeat). */
function withoutCovered(rules: EgressRule[]): EgressRule[] {
  return rules.filter((r, i) => !rules.some((o, j) => j !== i && contains(o, r) && (!contains(r, o) || j < i)));
}
