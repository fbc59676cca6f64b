// Where a VM's egress may go: the class of an IP address (loopback, private, link-local, …, or public), the
// operator's allow and deny entries, and the one decision the egress proxy asks for every address it would connect to.
//
// Refused unless an allow entry names it: every address that is not public — loopback (127/8, ::1), unspecified
// (0.0.0.0/8, ::), link-local (169.254/16 with the cloud metadata address 169.254.169.254, fe80::/10), private
// (10/8, 172.16/12, 192.168/16, fc00::/7, the deprecated site-local fec0::/10), shared CGNAT space (100.64/10),
// multicast (224/4, ff00::/8), reserved and broadcast (240/4), the IETF protocol block 192.0.0.0/24, benchmarking
// (198.18/15), documentation ranges and the discard prefix — and every address of one of the host's own interfaces.
// IPv6 forms that carry an IPv4 address (mapped ::ffff:a.b.c.d, compatible ::a.b.c.d, NAT64 64:ff9b::/96, 6to4
// 2002::/16) are judged by the IPv4 address inside.
import { isIP } from "node:net";

export type AddressClass = "loopback" | "unspecified" | "link-local" | "private" | "shared (CGNAT)" | "multicast" | "reserved" | "documentation" | "public";

/** An address as bytes: 4 for IPv4, 16 for IPv6. */
type Bytes = number[];

/** `a.b.c.d` → 4 bytes, or undefined. */
function parseV4(text: string): Bytes | undefined {
  const parts = text.split(".");
  if (parts.length !== 4) return undefined;
  const out: number[] = [];
  for (const p of parts) {
    if (!/^\d{1,3}$/.test(p) || Number(p) > 255) return undefined;
    out.push(Number(p));
  }
  return out;
}

/** An IPv6 text form (with `::`, an IPv4 tail, a `%zone`) → 16 bytes, or undefined. */
function parseV6(text: string): Bytes | undefined {
  let s = text.replace(/%.*$/, "");
  if (isIP(s) !== 6) return undefined;
  const v4Tail = /^(.*:)(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (v4Tail) {
    const v4 = parseV4(v4Tail[2]!);
    if (!v4) return undefined;
    s = `${v4Tail[1]}${((v4[0]! << 8) | v4[1]!).toString(16)}:${((v4[2]! << 8) | v4[3]!).toString(16)}`;
  }
  const halves = s.split("::");
  if (halves.length > 2) return undefined;
  const groupsOf = (part: string) => (part === "" ? [] : part.split(":"));
  const left = groupsOf(halves[0]!);
  const right = halves.length === 2 ? groupsOf(halves[1]!) : [];
  const fill = halves.length === 2 ? 8 - left.length - right.length : 0;
  const groups = [...left, ...Array<string>(Math.max(0, fill)).fill("0"), ...right];
  if (groups.length !== 8) return undefined;
  return groups.flatMap((g) => {
    const v = parseInt(g, 16);
    return [v >> 8, v & 0xff];
  });
}

/** Parses an IPv4 or IPv6 address; undefined when it is neither. */
export function parseAddress(text: string): Bytes | undefined {
  return isIP(text) === 4 ? parseV4(text) : parseV6(text);
}

function startsWith(b: Bytes, prefix: Bytes, bits: number): boolean {
  for (let i = 0; i < bits; i++) {
    const byte = i >> 3;
    const mask = 0x80 >> (i & 7);
    if (((b[byte] ?? 0) & mask) !== ((prefix[byte] ?? 0) & mask)) return false;
  }
  return true;
}

/** The IPv4 address an IPv6 address carries and is reached through (mapped, compatible, NAT64, 6to4), if any. */
export function embeddedV4(b: Bytes): Bytes | undefined {
  if (b.length !== 16) return undefined;
  const zeros = (from: number, to: number) => b.slice(from, to).every((x) => x === 0);
  if (zeros(0, 10) && b[10] === 0xff && b[11] === 0xff) return b.slice(12); // ::ffff:a.b.c.d
  if (zeros(0, 12) && !zeros(12, 16) && !(zeros(12, 15) && b[15] === 1)) return b.slice(12); // ::a.b.c.d (not :: or ::1)
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b && zeros(4, 12)) return b.slice(12); // 64:ff9b::/96
  if (b[0] === 0x20 && b[1] === 0x02) return b.slice(2, 6); // 2002:aabb:ccdd::/16 (6to4)
  return undefined;
}

const V4_RANGES: [AddressClass, string, number][] = [
  ["unspecified", "0.0.0.0", 8],
  ["private", "10.0.0.0", 8],
  ["shared (CGNAT)", "100.64.0.0", 10],
  ["loopback", "127.0.0.0", 8],
  ["link-local", "169.254.0.0", 16],
  ["private", "172.16.0.0", 12],
  ["reserved", "192.0.0.0", 24],
  ["documentation", "192.0.2.0", 24],
  ["private", "192.168.0.0", 16],
  ["reserved", "198.18.0.0", 15],
  ["documentation", "198.51.100.0", 24],
  ["documentation", "203.0.113.0", 24],
  ["multicast", "224.0.0.0", 4],
  ["reserved", "240.0.0.0", 4], // with the broadcast address 255.255.255.255
];

/**
 * The IPv4 ranges no egress may reach (every class but `public`), as CIDRs: what a Firecracker VM's nftables rules
 * refuse where it reaches out directly, not through the proxy (direct-lists.ts).
 */
export function refusedV4Cidrs(): string[] {
  return V4_RANGES.map(([, net, bits]) => `${net}/${bits}`);
}

const V6_RANGES: [AddressClass, string, number][] = [
  ["unspecified", "::", 128],
  ["loopback", "::1", 128],
  ["reserved", "100::", 64], // discard-only
  ["documentation", "2001:db8::", 32],
  ["private", "fc00::", 7],
  ["link-local", "fe80::", 10],
  ["private", "fec0::", 10], // site-local, deprecated
  ["multicast", "ff00::", 8],
];

const parsedRanges = (ranges: [AddressClass, string, number][]) => ranges.map(([cls, net, bits]) => ({ cls, net: parseAddress(net)!, bits }));
const V4 = parsedRanges(V4_RANGES);
const V6 = parsedRanges(V6_RANGES);

/** The class of an address (`public` when it is in none of the special ranges); throws on a non-address. */
export function classifyAddress(text: string): AddressClass {
  const b = parseAddress(text);
  if (!b) throw new Error(`not an IP address: ${text}`);
  return classifyBytes(b);
}

function classifyBytes(b: Bytes): AddressClass {
  const v4 = b.length === 4 ? b : embeddedV4(b);
  if (v4) return V4.find((r) => startsWith(v4, r.net, r.bits))?.cls ?? "public";
  return V6.find((r) => startsWith(b, r.net, r.bits))?.cls ?? "public";
}

/** One allow or deny entry: an address or CIDR, and optionally one port (`10.1.2.3:8080`, `[fd00::1]:443`, `10.0.0.0/8`). */
export interface EgressRule {
  net: Bytes;
  bits: number;
  port?: number;
  /** As written, for logs and refusals. */
  text: string;
}

/**
 * Parses one entry: `<address>`, `<address>/<bits>`, `<ipv4>:<port>`, `<ipv4>/<bits>:<port>`, `[<ipv6>]:<port>`,
 * `[<ipv6>/<bits>]:<port>`. Throws naming what is wrong.
 */
export function parseRule(entry: string): EgressRule {
  const text = entry.trim();
  let addr = text;
  let port: number | undefined;
  const bracketed = /^\[([^\]]+)\](?::(\d+))?$/.exec(text);
  if (bracketed) {
    addr = bracketed[1]!;
    if (bracketed[2] !== undefined) port = Number(bracketed[2]);
  } else if (!text.includes("::") && (text.match(/:/g) ?? []).length === 1) {
    const i = text.lastIndexOf(":");
    addr = text.slice(0, i);
    port = /^\d+$/.test(text.slice(i + 1)) ? Number(text.slice(i + 1)) : NaN;
  }
  if (port !== undefined && !(Number.isInteger(port) && port >= 1 && port <= 65535)) throw new Error(`egress rule "${text}": port must be 1..65535`);
  const [ip, bitsText] = addr.split("/");
  const net = parseAddress(ip ?? "");
  if (!net) throw new Error(`egress rule "${text}": not an IP address or CIDR`);
  const max = net.length * 8;
  const bits = bitsText === undefined ? max : Number(bitsText);
  if (!/^\d+$/.test(bitsText ?? String(max)) || bits > max) throw new Error(`egress rule "${text}": prefix length must be 0..${max}`);
  return { net, bits, ...(port !== undefined ? { port } : {}), text };
}

/** A comma- or space-separated list of entries (empty: none). */
export function parseRules(list: string): EgressRule[] {
  return list
    .split(/[\s,]+/)
    .filter(Boolean)
    .map(parseRule);
}

function matches(rule: EgressRule, b: Bytes, port: number): boolean {
  if (rule.port !== undefined && rule.port !== port) return false;
  const v4 = b.length === 4 ? b : embeddedV4(b);
  if (rule.net.length === 4) return v4 !== undefined && startsWith(v4, rule.net, rule.bits);
  return b.length === 16 && startsWith(b, rule.net, rule.bits);
}

export interface EgressRules {
  /** Wins over everything else: names what may be reached although it is refused by default (an internal service, a test's listener). */
  allow: EgressRule[];
  /** Refused on top of the built-in refusals (public ranges the operator wants closed: the host's public address behind NAT, …). */
  deny: EgressRule[];
}

export type EgressDecision = { allowed: true; why: string } | { allowed: false; why: string };

/**
 * May a VM's connection go to `address:port`? An allow entry wins; then a deny entry, every class but `public` and
 * the host's own addresses refuse; the rest is allowed. `hostAddresses` are the host's interface addresses now.
 */
export function decide(address: string, port: number, rules: EgressRules, hostAddresses: readonly string[]): EgressDecision {
  const b = parseAddress(address);
  if (!b) return { allowed: false, why: `${address} is not an IP address` };
  const allow = rules.allow.find((r) => matches(r, b, port));
  if (allow) return { allowed: true, why: `allowed by ${allow.text}` };
  const deny = rules.deny.find((r) => matches(r, b, port));
  if (deny) return { allowed: false, why: `denied by ${deny.text}` };
  const cls = classifyBytes(b);
  if (cls !== "public")
    return { allowed: false, why: `${address} is ${cls === "unspecified" ? "an unspecified" : cls === "reserved" ? "a reserved" : `a ${cls}`} address` };
  const v4 = b.length === 4 ? b : embeddedV4(b);
  const own = hostAddresses.some((h) => {
    const hb = parseAddress(h);
    if (!hb) return false;
    const hv4 = hb.length === 4 ? hb : embeddedV4(hb);
    return v4 && hv4 ? v4.join(".") === hv4.join(".") : hb.length === b.length && hb.every((x, i) => x === b[i]);
  });
  if (own) return { allowed: false, why: `${address} is an address of this host` };
  return { allowed: true, why: "public address" };
}
