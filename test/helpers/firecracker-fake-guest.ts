// The fake Firecracker's guest: its clock and memory, the guest agent behind hybrid vsock, and the workload HTTP on the guest IP.
//
// With drives the fake guest plays our init for a built image (fleet-agent/guest/init.sh): it finds the three drives
// by filesystem label (e2label), reads the launcher's spec from the launch drive (debugfs) and serves the workload
// on the PORT the spec gives, printing the init's `agentvm: …` lines on the console (its stdout) as the real one does.
//
// The guest's identity is in its memory as a real one's is: a random state (GET /random answers bytes drawn from it, so
// two copies of one snapshot answer the same until IDENTITY mixes entropy in), the agent id, hostname and clone marker
// IDENTITY sets (GET /identity, the /run/agentvm/identity of a real guest), and the checkpoint requests the workload
// made (POST /checkpoint-request?name=…, answered once by CHECKPOINTS).
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, fstatSync, openSync, rmSync, writeSync } from "node:fs";
import { createServer as createHttpServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import { decodeLaunchSpec, type LaunchSpec } from "../../fleet-agent/guest/launch-spec.ts";
import type { Config, FakeBehaviour, FakeFirecrackerOptions, GuestIdentityState, GuestMemory, VmState } from "./firecracker-fake-types.ts";
import { closeServer, envOf, formatNs, hostNowNs, now, parseGuestIp } from "./firecracker-fake-util.ts";
import { sbin } from "./sbin.ts";

/** What the guest sees of its VMM: the VM's state and configuration, and where the API's paths are on the host. */
export interface FakeVmView {
  state(): VmState;
  config(): Config;
  /** True when the guest came from a loaded snapshot. */
  restored(): boolean;
  /** True once the process ends: a guest still booting stays down. */
  ended(): boolean;
  host(p: string): string;
}

export class FakeGuest {
  private readonly opts: FakeFirecrackerOptions;
  private readonly behaviour: FakeBehaviour;
  /** The last key EXECKEY gave (GET /exec-key shows it). */
  private execKey: string | undefined;
  private readonly vm: FakeVmView;
  private counter = 0;
  private leases: number[] = [];
  private clockOffsetNs = 0n;
  private frozenNs: bigint | undefined;
  private lastSetNs = 0n;
  private guestUp = false;
  private resumeWaiters: (() => void)[] = [];
  private vsockServer: NetServer | undefined;
  private vsockConns = new Set<Socket>();
  private workload: HttpServer | undefined;
  private nextHostPort = 1_073_741_824;
  /** A built image's launch spec, read from its launch drive at boot (kept in the fake's memory snapshot). */
  private launch: LaunchSpec | undefined;
  private guestUpAt = 0;
  private guest: GuestIdentityState = { rng: randomBytes(32).toString("hex"), draws: 0, generation: 0, checkpointRequests: [] };

  constructor(opts: FakeFirecrackerOptions, behaviour: FakeBehaviour, vm: FakeVmView) {
    this.opts = opts;
    this.behaviour = behaviour;
    this.vm = vm;
  }

  private get config(): Config {
    return this.vm.config();
  }

  private get restored(): boolean {
    return this.vm.restored();
  }

  private host(p: string): string {
    return this.vm.host(p);
  }

  /** InstanceStart: the guest clock starts at the host's. */
  boot(): void {
    this.frozenNs = undefined;
    this.clockOffsetNs = 0n;
  }

  /** The VM pauses: the guest clock stops. */
  freeze(): void {
    this.frozenNs = this.guestNowNs();
  }

  /** The VM resumes: the guest clock goes on from where it stopped, and whatever waited for it runs. */
  thaw(): void {
    this.clockOffsetNs = this.frozenNs! - hostNowNs();
    this.frozenNs = undefined;
    for (const w of this.resumeWaiters.splice(0)) w();
  }

  /** Virtio vsock: active connections are reset (on snapshot, VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, and at the end). */
  resetConnections(): void {
    for (const c of this.vsockConns) c.destroy();
  }

  /** The servers the guest listens with, closing. */
  closeServers(): (Promise<void> | undefined)[] {
    return [this.vsockServer && closeServer(this.vsockServer), this.workload && closeServer(this.workload)];
  }

  /** The guest's memory as a paused VM's snapshot holds it. */
  memory(): GuestMemory {
    return {
      magic: "fake-fc-mem",
      ...(this.launch ? { launch: this.launch } : {}),
      counter: this.counter,
      leases: this.leases,
      guestClockNs: String(this.frozenNs),
      lastSetNs: String(this.lastSetNs),
      hostAtSnapshotNs: String(hostNowNs()),
      guest: this.guest,
    };
  }

  /** A loaded snapshot's memory, paused with its clock at `guestNs`. */
  restore(mem: GuestMemory, guestNs: bigint): void {
    this.launch = mem.launch;
    this.counter = mem.counter;
    this.leases = mem.leases;
    this.lastSetNs = BigInt(mem.lastSetNs);
    this.guest = mem.guest;
    this.frozenNs = guestNs;
  }

  guestNowNs(): bigint {
    return this.frozenNs ?? hostNowNs() + this.clockOffsetNs;
  }

  /** Resolves once the VM runs (a paused guest answers nothing). */
  private running(): Promise<void> {
    if (this.vm.state() === "Running") return Promise.resolve();
    return new Promise((r) => this.resumeWaiters.push(r));
  }

  async startGuest(): Promise<void> {
    const uds = this.config.vsock ? this.host(this.config.vsock.uds_path) : undefined;
    if (uds) {
      rmSync(uds, { force: true });
      this.vsockServer = createNetServer((sock) => this.onVsock(sock));
      await new Promise<void>((r) => this.vsockServer!.listen(uds, () => r()));
    }
    const ip = parseGuestIp(String(this.config["boot-source"]?.boot_args ?? ""));
    // The guest needs a moment to come up (or, restored, is up at once).
    const delay = this.restored ? 0 : (this.behaviour.guestBootMs ?? 50);
    setTimeout(() => {
      if (this.vm.ended()) return;
      let port = this.opts.workloadPort ?? 8080;
      // The guest agent is up first; a built image's workload only if the init could start its entrypoint (a restored
      // guest runs the one its memory holds).
      this.guestUp = true;
      this.guestUpAt = performance.now();
      if (this.config.drives.length > 0) {
        if (!this.restored && !this.initImage()) return;
        port = Number(envOf(this.launch, "PORT"));
      }
      if (ip) {
        this.workload = createHttpServer((req, res) => void this.onWorkload(req, res));
        this.workload.listen(port, ip);
      }
    }, delay);
  }

  /** What fleet-agent/guest/init.sh does with a built image's drives; false when the guest halts instead. */
  private initImage(): boolean {
    const byLabel = new Map<string, Record<string, unknown>>();
    for (const d of this.config.drives) {
      try {
        byLabel.set(execFileSync(sbin("e2label"), [this.host(String(d.path_on_host))], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim(), d);
      } catch {
        // not an ext4: no label
      }
    }
    // The real init powers off, which leaves Firecracker running with a halted guest (it implements no ACPI power-off).
    const failed = (why: string) => (this.opts.console?.(`agentvm: image setup failed: ${why}`), false);
    for (const label of ["agentvm-launch", "agentvm-image", "agentvm-disk"]) if (!byLabel.has(label)) return failed(`no drive labelled ${label}`);
    if (byLabel.get("agentvm-image")!.is_read_only !== true) return failed("the image drive is not read-only");
    if (byLabel.get("agentvm-disk")!.is_read_only !== false) return failed("cannot mount the agent disk read-write");
    try {
      const spec = execFileSync(sbin("debugfs"), ["-R", "cat /launch.spec", this.host(String(byLabel.get("agentvm-launch")!.path_on_host))], {
        stdio: ["ignore", "pipe", "ignore"],
      });
      this.launch = decodeLaunchSpec(spec);
    } catch {
      return failed("the launch drive has no launch.spec");
    }
    this.opts.console?.("agentvm: entrypoint started");
    if (this.behaviour.entrypointExits !== undefined) {
      this.opts.console?.(`agentvm: entrypoint exited with status ${this.behaviour.entrypointExits}`);
      return false;
    }
    return true;
  }

  private onVsock(sock: Socket): void {
    this.vsockConns.add(sock);
    sock.on("close", () => this.vsockConns.delete(sock));
    sock.on("error", () => {});
    let buf = "";
    let connected = false;
    sock.setEncoding("utf8");
    sock.on("data", async (chunk: string) => {
      buf += chunk;
      if (!connected) {
        const nl = buf.indexOf("\n");
        if (nl < 0) return;
        const m = /^CONNECT (\d+)$/.exec(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        const agentDead = this.behaviour.noGuestAgent === "always" || (this.behaviour.noGuestAgent === "afterRestore" && this.restored);
        const agentListens = this.guestUp && !agentDead && Number(m?.[1]) === (this.opts.guestAgentPort ?? 1024);
        if (!m || !agentListens) return void sock.destroy(); // nothing listens on that guest port
        await this.running();
        connected = true;
        sock.write(`OK ${this.nextHostPort++}\n`);
      }
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        await this.running();
        const answer = this.agentAnswer(line);
        this.opts.recordGuest?.({ pid: process.pid, command: line.split(" ")[1] ?? "", answer: answer.split(" ").slice(1).join(" "), at: now() });
        if (!sock.destroyed) sock.write(`${answer}\n`);
      }
    });
  }

  /** The guest agent line protocol of fleet-agent/drivers/common/guest-agent.ts. */
  private agentAnswer(line: string): string {
    const [id, cmd, arg] = line.split(" ");
    switch (cmd) {
      case "PING":
        return `${id} OK pong`;
      case "GETTIME":
        return `${id} OK ${formatNs(this.guestNowNs())}`;
      case "SETTIME": {
        const m = /^(\d+)\.(\d{9})(?: same-net)?$/.exec(arg ?? ""); // same-net: no neighbour table here to check
        if (!m) return `${id} ERR bad time`;
        const t = BigInt(m[1]!) * 1_000_000_000n + BigInt(m[2]!);
        if (t < this.lastSetNs) return `${id} OK stale ${formatNs(this.guestNowNs())}`;
        this.lastSetNs = t;
        this.clockOffsetNs = t - hostNowNs();
        return `${id} OK ${formatNs(this.guestNowNs())}`;
      }
      case "SYNC":
        return this.behaviour.syncFails ? `${id} ERR sync: Input/output error` : `${id} OK synced`;
      case "IDENTITY": {
        // fleet-agent/guest/guest-agent/identity.c's checks, and what it changes: RNG (entropy mixed in), hostname, identity file.
        const [agentId, hostname, entropy, clonedFrom] = line.split(" ").slice(2);
        if (!/^agt_[A-Za-z0-9_-]+$/.test(agentId ?? "")) return `${id} ERR bad agent id`;
        if (!/^(?=.{1,63}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?$/i.test(hostname ?? "")) return `${id} ERR bad hostname`;
        if (!/^[0-9a-f]{64}$/i.test(entropy ?? "")) return `${id} ERR entropy must be 64 hex digits`;
        if (!/^[A-Za-z0-9_-]+$/.test(clonedFrom ?? "")) return `${id} ERR bad clonedFrom`;
        const g = this.guest;
        this.guest = {
          ...g,
          rng: createHash("sha256").update(`${g.rng}:${entropy}`).digest("hex"),
          agentId,
          hostname,
          clonedFrom,
          generation: g.generation + 1,
        };
        return `${id} OK identity ${this.guest.generation} credited reseeded`;
      }
      case "EXECKEY": {
        if (this.behaviour.noExec) return `${id} ERR unknown command`;
        if (!/^[0-9a-f]{64}$/.test(arg ?? "")) return `${id} ERR bad key (64 hex)`;
        this.execKey = arg;
        return `${id} OK exec/1`;
      }
      case "CHECKPOINTS": {
        const names = this.guest.checkpointRequests;
        this.guest = { ...this.guest, checkpointRequests: [] };
        return names.length ? `${id} OK ${names.join(" ")}` : `${id} OK`;
      }
      case "LEASES": {
        const nowS = Number(this.guestNowNs() / 1_000_000_000n);
        return `${id} OK ${this.leases.filter((e) => e > nowS).length}`;
      }
      default:
        return `${id} ERR unknown command`;
    }
  }

  private async onWorkload(req: IncomingMessage, res: ServerResponse): Promise<void> {
    await this.running();
    const url = new URL(req.url ?? "/", "http://guest");
    const json = (body: unknown, status = 200) => {
      const text = JSON.stringify(body);
      res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) }).end(text);
    };
    if (url.pathname === "/") return json({ ok: true, agent: "demo" });
    if (url.pathname === "/counter") {
      if (req.method === "POST") this.counter++;
      return json({ count: this.counter });
    }
    if (url.pathname === "/clock") return json({ nowMs: Number(this.guestNowNs() / 1_000_000n) });
    if (url.pathname === "/launch") return json(this.launch ?? null);
    if (url.pathname === "/identity") {
      const g = this.guest;
      return g.generation === 0
        ? json({ error: "no identity yet" }, 404)
        : json({ agentId: g.agentId, hostname: g.hostname, clonedFrom: g.clonedFrom, generation: g.generation });
    }
    if (url.pathname === "/random") {
      const g = this.guest;
      this.guest = { ...g, draws: g.draws + 1 };
      return json({ hex: createHash("sha256").update(`${g.rng}:${g.draws}`).digest("hex") });
    }
    if (url.pathname === "/checkpoint-request" && req.method === "POST") {
      const name = url.searchParams.get("name") ?? "";
      if (!/^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$/.test(name)) return json({ error: "bad name" }, 400);
      this.guest = { ...this.guest, checkpointRequests: [...this.guest.checkpointRequests, name] };
      return json({ requested: name });
    }
    if (url.pathname === "/exec-key") return json({ key: this.execKey ?? null });
    if (url.pathname === "/ready") return json({ ready: true }, performance.now() - this.guestUpAt < (this.behaviour.readyAfterMs ?? 0) ? 503 : 200);
    if (url.pathname === "/disk-write" && req.method === "POST") {
      // The guest writes to its disk: a few bytes in the disk file's last block (free space of a fresh ext4).
      const disk = this.config.drives.find((d) => d.drive_id === "disk");
      if (!disk) return json({ error: "no disk" }, 404);
      const fd = openSync(this.host(String(disk.path_on_host)), "r+");
      try {
        const size = fstatSync(fd).size;
        writeSync(fd, Buffer.from(`written ${Date.now()}`), 0, undefined, size - 4096);
      } finally {
        closeSync(fd);
      }
      return json({ written: true });
    }
    if (url.pathname === "/work" && req.method === "POST") {
      // The guest's CPU time is the VMM process's CPU time: burn that much CPU (not wall) time here.
      const start = process.cpuUsage();
      const wantUs = Number(url.searchParams.get("ms") ?? 200) * 1000;
      for (let used = 0; used < wantUs; ) {
        const d = process.cpuUsage(start);
        used = d.user + d.system;
      }
      return json({ done: true });
    }
    if (url.pathname === "/lease" && req.method === "POST") {
      this.leases.push(Number(this.guestNowNs() / 1_000_000_000n) + Number(url.searchParams.get("seconds") ?? 60));
      return json({ leases: this.leases.length });
    }
    json({ error: "not found" }, 404);
  }
}
