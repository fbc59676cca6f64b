// Per-VM host networking for Firecracker: a claimed slot → tap name, /30 addresses, MAC, kernel `ip=` argument,
// and the call to `scripts/setup-firecracker-net.sh` that creates or removes the tap and its filter rules.
//
// A slot is claimed by creating `<slotsDir>/<n>` exclusively (content: the VM id), so two fleet-agents or two
// VMs never get the same tap. The VM keeps its slot (stored in its stateDir as net.json) across hibernate and
// wake: the guest's memory snapshot has the address baked in.
import { execFile } from "node:child_process";
import { mkdir, open, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { directEgressLists, type DirectEgressLists } from "../../egress/direct-lists.ts";

export interface NetOptions {
  /** Directory of slot claims shared by every VM on this host. */
  slotsDir: string;
  /** IPv4 range cut into /30s, one per VM: slot n uses base+4n+1 (host side) and base+4n+2 (guest). */
  cidr?: string;
  /** `scripts/setup-firecracker-net.sh` (or anything with its arguments); undefined = taps are made elsewhere. */
  setupScript?: string;
  /** Host interface egress leaves through, for VMs that allow it. */
  uplink?: string;
  /** The egress policy as the tap's rules take it (directEgressLists of EGRESS_ALLOW / EGRESS_DENY); the defaults alone when absent. */
  egress?: DirectEgressLists;
}

export interface VmNet {
  slot: number;
  tap: string;
  hostIp: string;
  guestIp: string;
  prefix: 30;
  mac: string;
}

export const DEFAULT_NET_CIDR = "172.30.0.0/16";
const NET_FILE = "net.json";

export function slotNet(cidr: string, slot: number): VmNet {
  const [addr, bitsText] = cidr.split("/");
  const bits = Number(bitsText);
  const base = ipToInt(addr ?? "");
  if (!Number.isInteger(bits) || bits < 8 || bits > 30) throw new Error(`network cidr ${cidr}: prefix must be /8../30`);
  if (slot < 0 || slot >= maxSlots(cidr)) throw new Error(`slot ${slot} outside ${cidr}`);
  const net = (base & maskOf(bits)) >>> 0;
  const first = net + slot * 4;
  return {
    slot,
    tap: `fcvm${slot}`,
    hostIp: intToIp(first + 1),
    guestIp: intToIp(first + 2),
    prefix: 30,
    // Locally administered, unicast; unique per slot.
    mac: `06:00:${hex((slot >>> 24) & 0xff)}:${hex((slot >>> 16) & 0xff)}:${hex((slot >>> 8) & 0xff)}:${hex(slot & 0xff)}`,
  };
}

export function maxSlots(cidr: string): number {
  const bits = Number(cidr.split("/")[1]);
  return 2 ** (32 - bits) / 4;
}

/** Linux `ip=` syntax (client::gateway:netmask::device:autoconf); the guest init configures eth0 from it. */
export function kernelIpArg(net: VmNet): string {
  return `ip=${net.guestIp}::${net.hostIp}:${intToIp(maskOf(net.prefix))}::eth0:off`;
}

/** The VM's slot: the one recorded in its stateDir if still claimed by it, else the lowest free one. */
export async function claimNet(opts: NetOptions, stateDir: string, vmId: string): Promise<VmNet> {
  const cidr = opts.cidr ?? DEFAULT_NET_CIDR;
  await mkdir(opts.slotsDir, { recursive: true });
  const recorded = await recordedNet(stateDir);
  if (recorded && (await claimOwner(opts.slotsDir, recorded.slot)) === vmId) return recorded;
  if (recorded && (await tryClaim(opts.slotsDir, recorded.slot, vmId))) return persist(stateDir, slotNet(cidr, recorded.slot));
  const limit = maxSlots(cidr);
  for (let slot = 0; slot < limit; slot++) {
    if (await tryClaim(opts.slotsDir, slot, vmId)) return persist(stateDir, slotNet(cidr, slot));
  }
  throw new Error(`no free network slot in ${cidr} (${limit} slots, claims in ${opts.slotsDir})`);
}

/** Gives the slot back (destroy). */
export async function releaseNet(opts: NetOptions, stateDir: string, vmId: string): Promise<void> {
  const recorded = await recordedNet(stateDir);
  if (recorded && (await claimOwner(opts.slotsDir, recorded.slot)) === vmId) await rm(join(opts.slotsDir, String(recorded.slot)), { force: true });
  await rm(join(stateDir, NET_FILE), { force: true });
}

export async function recordedNet(stateDir: string): Promise<VmNet | undefined> {
  try {
    return JSON.parse(await readFile(join(stateDir, NET_FILE), "utf8")) as VmNet;
  } catch {
    return undefined;
  }
}

/** What the setup script is told about one VM: whether it may reach out, through which interface, under which policy. */
export interface NetScriptOptions {
  allowEgress: boolean;
  uplink?: string | undefined;
  /** Absent: the default refusals only (no EGRESS_ALLOW / EGRESS_DENY). */
  egress?: DirectEgressLists | undefined;
}

const DEFAULT_EGRESS = directEgressLists({ allow: [], deny: [] });

/**
 * The setup script's arguments. Egress, where allowed, gets the QEMU VMs' egress proxy's policy (egress/direct-lists.ts):
 * the operator's allow entries as `--allow`, accepted first; the operator's deny entries and the default refusals
 * (private, loopback, link-local with the cloud metadata address, CGNAT, multicast, reserved) and all of IPv6 as `--deny`.
 */
export function netScriptArgs(action: "up" | "down", net: VmNet, opts: NetScriptOptions): string[] {
  const args = [action, "--tap", net.tap, "--host-ip", net.hostIp, "--guest-ip", net.guestIp, "--prefix", String(net.prefix)];
  if (action === "up" && opts.allowEgress) {
    const lists = opts.egress ?? DEFAULT_EGRESS;
    const allow = [...lists.v4.allow, ...lists.v6.allow];
    args.push("--allow-egress");
    if (allow.length > 0) args.push("--allow", allow.join(","));
    args.push("--deny", [...lists.v4.deny, ...lists.v6.deny].join(","));
  }
  if (opts.uplink) args.push("--uplink", opts.uplink);
  return args;
}

/** Runs the setup script: `up` creates the tap with its rules (idempotent), `down` removes them. */
export function runNetScript(script: string, action: "up" | "down", net: VmNet, opts: NetScriptOptions): Promise<void> {
  const args = netScriptArgs(action, net, opts);
  return new Promise((resolve, reject) => {
    execFile(script, args, { timeout: 20_000 }, (err, _stdout, stderr) => {
      if (err) reject(new Error(`${script} ${args.join(" ")} failed: ${stderr.trim().slice(-400) || err.message}`));
      else resolve();
    });
  });
}

/** Who holds `slot` (a VM id), or undefined when it is free. */
export function slotOwner(opts: NetOptions, slot: number): Promise<string | undefined> {
  return claimOwner(opts.slotsDir, slot);
}

/**
 * Makes `net`'s slot the one this VM asks for at its next claim, when its stateDir records none yet: a new agent forked
 * from a checkpoint, whose guest holds the checkpoint's address in its memory. claimNet takes the slot if it is free
 * then, else another one (and the restore then boots cold: restore.ts). Nothing is claimed here.
 */
export async function preferNet(stateDir: string, net: VmNet): Promise<boolean> {
  if (await recordedNet(stateDir)) return false;
  await persist(stateDir, net);
  return true;
}

async function persist(stateDir: string, net: VmNet): Promise<VmNet> {
  await writeFile(join(stateDir, NET_FILE), `${JSON.stringify(net)}\n`);
  return net;
}

async function tryClaim(slotsDir: string, slot: number, vmId: string): Promise<boolean> {
  try {
    const fh = await open(join(slotsDir, String(slot)), "wx");
    await fh.writeFile(vmId);
    await fh.close();
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw err;
  }
}

async function claimOwner(slotsDir: string, slot: number): Promise<string | undefined> {
  try {
    return (await readFile(join(slotsDir, String(slot)), "utf8")).trim();
  } catch {
    return undefined;
  }
}

function ipToInt(ip: string): number {
  const parts = ip.split(".").map(Number);
  if (parts.length !== 4 || parts.some((p) => !Number.isInteger(p) || p < 0 || p > 255)) throw new Error(`bad IPv4 address ${ip}`);
  return ((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0;
}

function intToIp(n: number): string {
  return [n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff].join(".");
}

function maskOf(bits: number): number {
  return bits === 0 ? 0 : (0xffffffff << (32 - bits)) >>> 0;
}

function hex(n: number): string {
  return n.toString(16).padStart(2, "0");
}
