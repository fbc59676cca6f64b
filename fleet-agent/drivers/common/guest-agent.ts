// Host side of the guest agent's line protocol (virtio-serial for qemu, vsock for firecracker).
//
// Protocol, one request per line, answers matched by id:
//   host → guest   "<id> PING"                      guest → host  "<id> OK pong"
//                  "<id> SETTIME <sec>.<nsec9>[ same-net]"         "<id> OK <sec>.<nsec9>"       (guest clock after setting)
//                                                                  "<id> OK stale <sec>.<nsec9>" (older than the last applied: ignored)
//                                                                   (without same-net it also forgets unresolved neighbours: the
//                                                                   host's forwarded addresses may have changed; guest-agent/clock.c)
//                  "<id> GETTIME"                                  "<id> OK <sec>.<nsec9>"
//                  "<id> LEASES"                                   "<id> OK <count>"             (live keep-awake leases)
//                  "<id> LISTENING <port>"                         "<id> OK 1|0"                 (a socket in the guest listens on
//                                                                   that TCP port: an image's readiness, guest-agent/listening.c)
//                  "<id> SYNC"                                     "<id> OK synced"              (sync(2) done: the disks hold what was written)
//                  "<id> IDENTITY <agentId> <hostname> <hex64> <clonedFrom>"
//                                                                  "<id> OK identity <n> credited|uncredited reseeded|noreseed"
//                                                                   (a clone's fresh identity: the 32 bytes mixed into the RNG,
//                                                                   credited by RNDADDENTROPY or only written, the CRNG reseeded;
//                                                                   sethostname; /run/agentvm/identity rewritten; n = identities
//                                                                   applied since boot. Checked in the guest: agt_[A-Za-z0-9_-]+,
//                                                                   RFC 1123 ≤ 63, exactly 64 hex, [A-Za-z0-9_-]+)
//                  "<id> CHECKPOINTS"                              "<id> OK[ <name>…]"           (checkpoint requests the workload
//                                                                   made, each removed as it is named: answered once)
//                  "<id> EXECKEY <hex64>"                          "<id> OK exec/1"              (the key every request to the exec
//                                                                   server, guest-exec on port 1025, must carry: written 0600 to
//                                                                   /run/guest-exec/key, outside the workload's root; a guest built
//                                                                   before exec answers "ERR unknown command": GuestOutdated)
//                  "<id> PROBE <ipv4> <port> <ms>"                 "<id> OK connected <hex>|-"   (a TCP connect from inside the VM;
//                                                                  "<id> OK refused|timeout|unreachable|reset|error <why>"
//                                                                   connected: it sent "agentvm-probe\n" and read up to a newline)
//                  "<id> PROBEVIA <ipv4> <port> <host:port> <ms>"  "<id> OK status <code> <hex>|-" (an HTTP CONNECT through the proxy
//                                                                  "<id> OK proxy-<outcome>"      at ipv4:port; after a 200 the same
//                                                                   exchange as PROBE through the tunnel)
//   any failure                                                    "<id> ERR <message>"
// The workload takes a lease by writing a file into /run/leases/ whose content is its expiry in
// unix seconds; it drops it by deleting the file.
// A workload learns it was cloned from /run/agentvm/identity (there is no VMGenID on microvm): "agentId=…\nhostname=…
// \nclonedFrom=…\ngeneration=<n>\n", replaced by rename; a changed agentId or generation means a new identity. It asks for
// a checkpoint by creating /run/agentvm/checkpoint-requests/<name> ([A-Za-z0-9._-]{1,64}, not starting with a dot).
// A built image's workload sees both at the same paths (init binds /run/agentvm into its root; leases there are at
// /run/agentvm/leases/).
import type { Duplex } from "node:stream";
import { AppError } from "../../../lib/errors.ts";

export interface GuestTime {
  /** Guest wall clock in nanoseconds since the epoch. */
  ns: bigint;
}

/** How a TCP connection attempt from inside the VM ended. */
export type ProbeOutcome = "connected" | "refused" | "timeout" | "unreachable" | "reset" | "error";

export interface ProbeResult {
  outcome: ProbeOutcome;
  /** Connected: what the far end answered to the probe's `agentvm-probe\n` (up to its first newline, ≤ 96 bytes). */
  received: Buffer;
  /** `error`: the guest's strerror. */
  detail?: string;
}

export interface ProxyProbeResult {
  /** Reaching the proxy itself: `connected` when it answered an HTTP status, `silent` when it closed without one. */
  proxy: ProbeOutcome | "silent";
  /** The proxy's answer to the CONNECT. */
  status?: number;
  /** After a 200: what the destination answered through the tunnel. */
  received: Buffer;
}

/** A clone's fresh identity, pushed before its first request. */
export interface GuestIdentity {
  agentId: string;
  hostname: string;
  /** 32 bytes for the guest's RNG (e.g. crypto.randomBytes(32)). */
  entropy: Uint8Array;
  /** What the VM was cloned from: a template's or checkpoint's id (the guest takes [A-Za-z0-9_-]+). */
  clonedFrom: string;
}

export interface IdentityApplied {
  /** Identities applied since the guest booted (a clone carries its source's count on). */
  generation: number;
  /** The RNDADDENTROPY ioctl took the bytes (256 bits credited); false: they were only written (mixed, not credited). */
  credited: boolean;
  /** The guest's CRNG was reseeded at once, so its getrandom() output already depends on the bytes. */
  reseeded: boolean;
}

/**
 * One protocol token: the line protocol splits on spaces and ends at a newline, so a value with whitespace or a control
 * character would change the request. Anything else goes to the guest, which is the one that validates the values.
 */
export function protocolToken(name: string, value: string): string {
  if (value.length === 0 || /[\s\x00-\x1f\x7f]/.test(value))
    throw new AppError("bad_request", `guest agent: ${name} must be one non-empty token without spaces or control characters`);
  return value;
}

export class GuestAgentError extends Error {
  override name = "GuestAgentError";
}

/** A request the guest did not answer in time (the channel is still open: asking again may work). */
export class GuestAgentTimeout extends GuestAgentError {
  override name = "GuestAgentTimeout";
}

export class GuestAgentClient {
  private nextId = 1;
  private buffer = "";
  private pending = new Map<number, { resolve: (v: string) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  private closed: Error | undefined;
  private readonly stream: Duplex;

  constructor(stream: Duplex) {
    this.stream = stream;
    stream.setEncoding?.("utf8");
    stream.on("data", (chunk: string | Buffer) => this.onData(chunk.toString()));
    const fail = (err?: Error) => this.failAll(err ?? new GuestAgentError("guest agent channel closed"));
    stream.on("error", fail);
    stream.on("close", () => fail());
  }

  async ping(timeoutMs = 2000): Promise<void> {
    const answer = await this.call("PING", timeoutMs);
    if (answer !== "pong") throw new GuestAgentError(`unexpected ping answer: ${answer}`);
  }

  /**
   * Sets the guest wall clock to `hostNs`; answers the guest clock read back after setting, and whether it was stale.
   * `sameNetwork`: the addresses the host forwards are the ones the guest last ran against, so the guest skips its
   * neighbour check (a guest agent older than the flag answers `ERR bad time`: `fixGuestClock` then asks without it).
   */
  async setTime(hostNs: bigint, opts: { timeoutMs?: number; sameNetwork?: boolean } = {}): Promise<{ guestNs: bigint; stale: boolean }> {
    const answer = await this.call(`SETTIME ${formatNs(hostNs)}${opts.sameNetwork ? " same-net" : ""}`, opts.timeoutMs ?? 2000);
    const stale = answer.startsWith("stale ");
    return { guestNs: parseNs(stale ? answer.slice(6) : answer), stale };
  }

  async getTime(timeoutMs = 2000): Promise<bigint> {
    return parseNs(await this.call("GETTIME", timeoutMs));
  }

  async leases(timeoutMs = 2000): Promise<number> {
    const answer = await this.call("LEASES", timeoutMs);
    const n = Number(answer);
    if (!Number.isInteger(n) || n < 0) throw new GuestAgentError(`unexpected leases answer: ${answer}`);
    return n;
  }

  /**
   * Whether a socket in the guest listens on TCP `port` (the kernel's tables, not a connection: the workload sees
   * nothing). Undefined from a guest built before the command (the caller falls back to another probe).
   */
  async listening(port: number, timeoutMs = 2000): Promise<boolean | undefined> {
    let answer: string;
    try {
      answer = await this.call(`LISTENING ${port}`, timeoutMs);
    } catch (err) {
      if (err instanceof GuestAgentError && /unknown command/.test(err.message)) return undefined;
      throw err;
    }
    if (answer !== "0" && answer !== "1") throw new GuestAgentError(`unexpected listening answer: ${answer}`);
    return answer === "1";
  }

  /**
   * Flushes the guest's dirty pages to its disks (sync(2)): asked before a hibernation, so that a cold boot from the
   * disk alone finds what the agent wrote. The guest agent answers nothing else while it runs.
   */
  async sync(timeoutMs = 10_000): Promise<void> {
    const answer = await this.call("SYNC", timeoutMs);
    if (answer !== "synced") throw new GuestAgentError(`unexpected sync answer: ${answer}`);
  }

  /**
   * Gives the VM a fresh identity (a clone's, before its first request): entropy mixed into its RNG, its hostname,
   * and /run/agentvm/identity for the workload. Rejects with the guest's ERR when it refuses a value.
   */
  async identity(i: GuestIdentity, timeoutMs = 2000): Promise<IdentityApplied> {
    const tokens = [
      protocolToken("agentId", i.agentId),
      protocolToken("hostname", i.hostname),
      Buffer.from(i.entropy.buffer, i.entropy.byteOffset, i.entropy.byteLength).toString("hex") || "-",
      protocolToken("clonedFrom", i.clonedFrom),
    ];
    const answer = await this.call(`IDENTITY ${tokens.join(" ")}`, timeoutMs);
    const m = /^identity (\d+) (credited|uncredited)(?: (reseeded|noreseed))?$/.exec(answer);
    if (!m) throw new GuestAgentError(`unexpected identity answer: ${answer}`);
    return { generation: Number(m[1]), credited: m[2] === "credited", reseeded: m[3] === "reseeded" };
  }

  /**
   * The checkpoints the workload asked for since the last poll (files in /run/agentvm/checkpoint-requests/): the guest
   * removes each one it names, so each request comes back once.
   */
  async checkpointRequests(timeoutMs = 2000): Promise<string[]> {
    const answer = await this.call("CHECKPOINTS", timeoutMs);
    return answer === "" ? [] : answer.split(" ").filter(Boolean);
  }

  /**
   * Gives the guest's exec server (fleet-agent/guest/guest-exec/) the key its requests must carry (64 lowercase hex),
   * once per run of the VM. A guest built before exec does not know the command: AppError `guest_outdated` (409).
   */
  async execKey(key: string, timeoutMs = 2000): Promise<void> {
    if (!/^[0-9a-f]{64}$/.test(key)) throw new AppError("bad_request", "the exec key must be 64 lowercase hex");
    let answer: string;
    try {
      answer = await this.call(`EXECKEY ${key}`, timeoutMs);
    } catch (err) {
      if (err instanceof GuestAgentError && /unknown command/.test(err.message))
        throw new AppError("guest_outdated", "this agent's guest was built before exec; restart it to update");
      throw err;
    }
    if (answer !== "exec/1") throw new GuestAgentError(`unexpected exec key answer: ${answer}`);
  }

  /**
   * From inside the VM, a TCP connect to `ip:port` (IPv4), as a workload's would go: for tests of what the guest can
   * reach. The guest agent answers nothing else meanwhile (at most 10 s in the guest).
   */
  async probe(ip: string, port: number, timeoutMs = 2000): Promise<ProbeResult> {
    return parseProbe(await this.call(`PROBE ${ip} ${port} ${timeoutMs}`, timeoutMs + 5000));
  }

  /** From inside the VM, `CONNECT target` (host:port) through the HTTP proxy at `proxyIp:proxyPort`, then the probe's exchange. */
  async probeVia(proxyIp: string, proxyPort: number, target: string, timeoutMs = 5000): Promise<ProxyProbeResult> {
    const answer = await this.call(`PROBEVIA ${proxyIp} ${proxyPort} ${target} ${timeoutMs}`, timeoutMs + 5000);
    const status = /^status (\d{3}) (\S+)$/.exec(answer);
    if (status) return { proxy: "connected", status: Number(status[1]), received: hexOrNothing(status[2]!) };
    const failed = /^proxy-(\w+)/.exec(answer);
    if (failed) return { proxy: failed[1] as ProxyProbeResult["proxy"], received: Buffer.alloc(0) };
    throw new GuestAgentError(`unexpected probe answer: ${answer}`);
  }

  close(): void {
    this.stream.destroy();
  }

  private call(command: string, timeoutMs: number): Promise<string> {
    if (this.closed) return Promise.reject(this.closed);
    const id = this.nextId++;
    return new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new GuestAgentTimeout(`guest agent did not answer ${command.split(" ")[0]} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.stream.write(`${id} ${command}\n`);
    });
  }

  private onData(chunk: string): void {
    this.buffer += chunk;
    let nl: number;
    while ((nl = this.buffer.indexOf("\n")) >= 0) {
      const line = this.buffer.slice(0, nl).replace(/\r$/, "");
      this.buffer = this.buffer.slice(nl + 1);
      const m = /^(\d+) (OK|ERR)(?: (.*))?$/.exec(line);
      if (!m) continue; // boot noise on the channel before the agent started
      const waiter = this.pending.get(Number(m[1]));
      if (!waiter) continue; // answer to a request that already timed out
      this.pending.delete(Number(m[1]));
      clearTimeout(waiter.timer);
      if (m[2] === "OK") waiter.resolve(m[3] ?? "");
      else waiter.reject(new GuestAgentError(`guest agent: ${m[3] ?? "error"}`));
    }
  }

  private failAll(err: Error): void {
    if (this.closed) return;
    this.closed = err;
    for (const [, w] of this.pending) {
      clearTimeout(w.timer);
      w.reject(err);
    }
    this.pending.clear();
  }
}

function hexOrNothing(text: string): Buffer {
  return text === "-" ? Buffer.alloc(0) : Buffer.from(text, "hex");
}

function parseProbe(answer: string): ProbeResult {
  const connected = /^connected (\S+)$/.exec(answer);
  if (connected) return { outcome: "connected", received: hexOrNothing(connected[1]!) };
  const m = /^(refused|timeout|unreachable|reset|error)(?: (.*))?$/.exec(answer);
  if (!m) throw new GuestAgentError(`unexpected probe answer: ${answer}`);
  return { outcome: m[1] as ProbeOutcome, received: Buffer.alloc(0), ...(m[2] ? { detail: m[2] } : {}) };
}

export function formatNs(ns: bigint): string {
  const sec = ns / 1_000_000_000n;
  const nsec = ns % 1_000_000_000n;
  return `${sec}.${nsec.toString().padStart(9, "0")}`;
}

export function parseNs(text: string): bigint {
  const m = /^(\d+)\.(\d{9})$/.exec(text.trim());
  if (!m) throw new GuestAgentError(`bad time from guest agent: ${text}`);
  return BigInt(m[1]!) * 1_000_000_000n + BigInt(m[2]!);
}

/**
 * Host wall clock in nanoseconds, taken fresh for every attempt: the process's start time plus the monotonic
 * clock gives sub-millisecond precision that never steps backwards; should the wall clock have been stepped
 * since (by more than 5 ms), the plain wall clock wins.
 */
export function hostNowNs(): bigint {
  const precise = performance.timeOrigin + performance.now();
  const wall = Date.now();
  const ms = Math.abs(precise - wall) <= 5 ? precise : wall;
  return BigInt(Math.round(ms * 1e6));
}

/**
 * The clock fix after a restore: measure the skew, set the guest clock from a fresh host timestamp; the guest's
 * answer to SETTIME is its clock read right after setting it, which measures the skew left (against the host's clock
 * half the round trip after the timestamp, as `measureSkewMs` reads it). That estimate can be off by half the round
 * trip, and is when the way in is the slow half (a restored guest runs its SETTIME path cold under TCG: the clock is
 * set late in the trip, so it lags by most of it). So it retries with a new timestamp until even the worst case,
 * the estimate plus half the round trip, is under half of `targetMs`: two round trips when the first set is quick,
 * where a separate read-back made three; a slow first set is followed by a quick one on the now warm path.
 * `firstAnswerWithinMs`: the first request is also the first the guest answers after it runs again (a restored
 * guest's translated code is cold): it is asked again every 500 ms until then; absent, it gets the default timeout.
 * `onFirstAnswer`: told how long that first answer took. `sameNetwork`: as for `setTime`; a guest too old for it is
 * asked again without it, with a fresh timestamp.
 */
export async function fixGuestClock(
  agent: GuestAgentClient,
  opts: { targetMs?: number; attempts?: number; firstAnswerWithinMs?: number; onFirstAnswer?: (ms: number) => void; sameNetwork?: boolean } = {},
): Promise<{ skewBeforeMs: number; skewAfterMs: number; clockFixMs: number }> {
  const started = performance.now();
  const target = opts.targetMs ?? 50;
  const before = opts.firstAnswerWithinMs === undefined ? await measureSkewMs(agent) : await firstSkewMs(agent, started + opts.firstAnswerWithinMs);
  opts.onFirstAnswer?.(performance.now() - started);
  let after = before;
  const flags = { sameNetwork: opts.sameNetwork === true };
  for (let i = 0; i < (opts.attempts ?? 3); i++) {
    const { sent, guestNs, rttMs } = await setFromHost(agent, flags);
    after = Number(guestNs - sent) / 1e6 - rttMs / 2;
    if (Math.abs(after) + rttMs / 2 < target / 2) break;
  }
  return { skewBeforeMs: before, skewAfterMs: after, clockFixMs: performance.now() - started };
}

/**
 * One SETTIME from a fresh host timestamp, with its round trip. A guest agent older than `same-net` refuses it as a
 * bad time: asked again without it, from a new timestamp, and `flags` remembers that for the next attempts.
 */
async function setFromHost(agent: GuestAgentClient, flags: { sameNetwork: boolean }): Promise<{ sent: bigint; guestNs: bigint; rttMs: number }> {
  for (;;) {
    const t0 = performance.now();
    const sent = hostNowNs();
    try {
      const { guestNs } = await agent.setTime(sent, { sameNetwork: flags.sameNetwork });
      return { sent, guestNs, rttMs: performance.now() - t0 };
    } catch (err) {
      if (!flags.sameNetwork || !(err instanceof GuestAgentError) || !/bad time/.test(err.message)) throw err;
      flags.sameNetwork = false;
    }
  }
}

/** `measureSkewMs`, asked again every 500 ms (a late answer to an earlier ask is dropped) until `deadline`. */
async function firstSkewMs(agent: GuestAgentClient, deadline: number): Promise<number> {
  for (;;) {
    const left = deadline - performance.now();
    try {
      return await measureSkewMs(agent, Math.max(50, Math.min(500, left)));
    } catch (err) {
      if (!(err instanceof GuestAgentTimeout) || performance.now() >= deadline) throw err;
    }
  }
}

/** Guest minus host wall clock in ms, corrected for half the round trip. */
export async function measureSkewMs(agent: GuestAgentClient, timeoutMs?: number): Promise<number> {
  const t0 = performance.now();
  const hostBefore = Date.now();
  const guestNs = await agent.getTime(timeoutMs);
  const rtt = performance.now() - t0;
  const hostMid = hostBefore + rtt / 2;
  return Number(guestNs / 1000n) / 1000 - hostMid;
}
