// A stand-in Firecracker for tests: its HTTP API on a unix socket, enforcing the documented rules and validating
// every request body against firecracker.yaml, plus a tiny fake guest (workload HTTP on the guest IP from the
// kernel `ip=` argument, guest agent behind hybrid vsock, a wall clock that stops while paused/snapshotted).
//
// Rules enforced (Firecracker docs and swagger): pre-boot-only PUTs are refused after InstanceStart; PATCH /vm
// needs a started VM; /snapshot/create needs a Paused VM (Diff needs dirty page tracking); /snapshot/load only
// on a fresh process (nothing configured) and a failed load ends the process; unknown fields and schema
// violations answer 400 `{"fault_message"}`; SendCtrlAltDel with `reboot=k` ends the process. A drive's file must
// exist when it is PUT, and again when a snapshot is loaded (Firecracker reopens the drives the snapshot names).
//
// With drives the fake guest plays our init for a built image (fleet-agent/guest/init.sh): it finds the three drives
// by filesystem label (e2label), reads the launcher's spec from the launch drive (debugfs) and serves the workload
// on the PORT the spec gives, printing the init's `agentvm: …` lines on the console (its stdout) as the real one does.
//
// The guest's identity is in its memory as a real one's is: a random state (GET /random answers bytes drawn from it, so
// two copies of one snapshot answer the same until IDENTITY mixes entropy in), the agent id, hostname and clone marker
// IDENTITY sets (GET /identity, the /run/agentvm/identity of a real guest), and the checkpoint requests the workload
// made (POST /checkpoint-request?name=…, answered once by CHECKPOINTS). A loaded snapshot whose vsock socket path is
// taken fails (Firecracker binds the UDS again on restore), as does one that names a missing drive.
import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, existsSync, fstatSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { createServer as createHttpServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import { join } from "node:path";
import { decodeLaunchSpec, type LaunchSpec } from "../../fleet-agent/guest/launch-spec.ts";
import type { FirecrackerSpec } from "./firecracker-spec.ts";
import { sbin } from "./sbin.ts";

export interface FakeBehaviour {
  /** Answer these load/config fields like an older firecracker that does not know them. */
  rejectFields?: string[];
  /** /snapshot/load fails with this fault message, and the process ends (as documented). */
  loadFault?: string;
  /** Delay the answer to PATCH /vm (to abort a hibernation mid-way). */
  pauseDelayMs?: number;
  /** "ignore": clock_realtime has no effect (guest clocksource is not kvm-clock), the wall clock stays behind. */
  clockRealtime?: "honour" | "ignore";
  /** Time from InstanceStart/load until the guest agent and workload listen. */
  guestBootMs?: number;
  /** The guest agent never listens: always (a broken image) or only in restored guests (a broken snapshot). */
  noGuestAgent?: "always" | "afterRestore";
  /** A built image's entrypoint exits with this status right after it started (the init says so on the console). */
  entrypointExits?: number;
  /** A built image's GET /ready answers 503 for this long after the guest came up, then 200. */
  readyAfterMs?: number;
  /** The guest agent answers SYNC with an error. */
  syncFails?: boolean;
}

export interface FakeRequestRecord {
  pid: number;
  method: string;
  path: string;
  body: unknown;
  status: number;
  fault?: string;
  schemaErrors: string[];
  /** When it was answered (ms since the epoch, fractional): orders API calls against guest agent commands. */
  at: number;
}

/** A command the fake guest agent answered (PING, SYNC, …). */
export interface FakeGuestRecord {
  pid: number;
  command: string;
  answer: string;
  at: number;
}

export interface FakeFirecrackerOptions {
  apiSock: string;
  /** Chroot of a jailed process: every path the API names is resolved under it. */
  root?: string;
  spec: FirecrackerSpec;
  version?: string;
  id?: string;
  behaviour?: FakeBehaviour;
  guestAgentPort?: number;
  workloadPort?: number;
  record?: (r: FakeRequestRecord) => void;
  recordGuest?: (r: FakeGuestRecord) => void;
  /** The serial console (Firecracker writes it to its stdout). */
  console?: (line: string) => void;
  /** The process must end (load failure, guest reboot); in the fake binary this is process.exit. */
  exit?: (code: number, why: string) => void;
}

type VmState = "Not started" | "Running" | "Paused";

interface GuestMemory {
  magic: "fake-fc-mem";
  launch?: LaunchSpec;
  counter: number;
  leases: number[];
  guestClockNs: string;
  lastSetNs: string;
  hostAtSnapshotNs: string;
  guest: GuestIdentityState;
}

/** What the fake guest keeps of its identity (in its memory: a snapshot carries it). */
interface GuestIdentityState {
  /** The RNG's state (hex): a booted guest's is its own, a restored copy's is the snapshot's. */
  rng: string;
  draws: number;
  agentId?: string;
  hostname?: string;
  clonedFrom?: string;
  /** Identities applied since boot. */
  generation: number;
  checkpointRequests: string[];
}

interface StateFile {
  magic: "fake-fc-state";
  version: string;
  config: Config;
}

interface Config {
  "machine-config"?: Record<string, unknown>;
  "boot-source"?: Record<string, unknown>;
  drives: Record<string, unknown>[];
  "network-interfaces": Record<string, unknown>[];
  vsock?: { guest_cid: number; uds_path: string };
}

const PRE_BOOT_ONLY = new Set([
  "putGuestBootSource",
  "putGuestDriveByID",
  "putMachineConfiguration",
  "putGuestNetworkInterfaceByID",
  "putGuestVsock",
  "loadSnapshot",
]);

export class FakeFirecracker {
  private readonly opts: FakeFirecrackerOptions;
  private readonly behaviour: FakeBehaviour;
  private readonly version: string;
  private readonly api: HttpServer;
  private state: VmState = "Not started";
  private config: Config = { drives: [], "network-interfaces": [] };
  private configuredSomething = false;
  private trackDirty = false;
  private restored = false;
  private ended = false;
  // Fake guest
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

  constructor(opts: FakeFirecrackerOptions) {
    this.opts = opts;
    this.behaviour = opts.behaviour ?? {};
    this.version = opts.version ?? "1.10.1";
    this.api = createHttpServer((req, res) => void this.onRequest(req, res));
  }

  /** A path as named in the API, on the host (under the chroot when jailed). */
  private host(p: string): string {
    return this.opts.root ? join(this.opts.root, p) : p;
  }

  listen(): Promise<void> {
    if (existsSync(this.opts.apiSock)) throw new Error(`Failed to open the API socket at ${this.opts.apiSock}: Address in use`);
    return new Promise((resolve) => this.api.listen(this.opts.apiSock, () => resolve()));
  }

  async close(): Promise<void> {
    this.ended = true;
    for (const c of this.vsockConns) c.destroy();
    await Promise.all([closeServer(this.api), this.vsockServer && closeServer(this.vsockServer), this.workload && closeServer(this.workload)]);
    rmSync(this.opts.apiSock, { force: true });
    if (this.config.vsock) rmSync(this.host(this.config.vsock.uds_path), { force: true });
  }

  get vmState(): VmState {
    return this.state;
  }

  private async onRequest(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const method = req.method ?? "GET";
    const path = (req.url ?? "/").split("?")[0]!;
    let raw = "";
    for await (const chunk of req) raw += chunk;
    let body: unknown;
    let schemaErrors: string[] = [];
    if (raw !== "") {
      try {
        body = JSON.parse(raw);
      } catch {
        return this.answer(
          res,
          { method, path, body: raw, schemaErrors: ["body is not JSON"] },
          400,
          "An error occurred when deserializing the json body of a request: not JSON",
        );
      }
    }
    const op = this.opts.spec.operation(method, path);
    if (!op)
      return this.answer(res, { method, path, body, schemaErrors: [`no such operation`] }, 400, `Invalid request method and/or path: ${method} ${path}.`);
    schemaErrors = this.opts.spec.validateRequest(method, path, body);
    const rec = { method, path, body, schemaErrors };
    if (schemaErrors.length > 0)
      return this.answer(res, rec, 400, `An error occurred when deserializing the json body of a request: ${schemaErrors.join("; ")}`);
    const rejected = this.behaviour.rejectFields?.find((f) => isRecord(body) && f in body);
    if (rejected) return this.answer(res, rec, 400, `An error occurred when deserializing the json body of a request: unknown field \`${rejected}\`.`);
    try {
      const result = await this.handle(op.operationId, op.pathParams, body as Record<string, unknown>);
      this.answer(res, rec, result === undefined ? 204 : 200, undefined, result);
    } catch (err) {
      const fault = err instanceof Fault ? err : new Fault((err as Error).message);
      this.answer(res, rec, 400, fault.message);
      if (fault.fatal) setTimeout(() => this.opts.exit?.(1, fault.message), 20);
    }
  }

  private answer(res: ServerResponse, rec: Omit<FakeRequestRecord, "pid" | "status" | "at">, status: number, fault?: string, result?: unknown): void {
    this.opts.record?.({ pid: process.pid, ...rec, status, ...(fault ? { fault } : {}), at: now() });
    if (fault) {
      const text = JSON.stringify({ fault_message: fault });
      res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) }).end(text);
    } else if (result === undefined) {
      res.writeHead(204).end();
    } else {
      const text = JSON.stringify(result);
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) }).end(text);
    }
  }

  private async handle(operationId: string, params: Record<string, string>, body: Record<string, unknown>): Promise<unknown> {
    if (PRE_BOOT_ONLY.has(operationId) && this.state !== "Not started") throw new Fault("The requested operation is not supported after starting the microVM.");
    switch (operationId) {
      case "describeInstance":
        return { app_name: "Firecracker", id: this.opts.id ?? "anonymous-instance", state: this.state, vmm_version: this.version };
      case "getFirecrackerVersion":
        return { firecracker_version: this.version };
      case "getExportVmConfig":
        return { ...this.config, "network-interfaces": this.config["network-interfaces"], drives: this.config.drives };
      case "getMachineConfiguration":
        return this.config["machine-config"] ?? { vcpu_count: 1, mem_size_mib: 128, smt: false, track_dirty_pages: false };
      case "putMachineConfiguration":
        this.configuredSomething = true;
        this.config["machine-config"] = body;
        this.trackDirty = body.track_dirty_pages === true;
        return;
      case "putGuestBootSource":
        for (const key of ["kernel_image_path", "initrd_path"] as const) {
          const p = body[key];
          if (typeof p === "string" && !existsSync(this.host(p)))
            throw new Fault(`The ${key === "kernel_image_path" ? "kernel" : "initrd"} file cannot be opened: No such file or directory (os error 2)`);
        }
        this.configuredSomething = true;
        this.config["boot-source"] = body;
        return;
      case "putGuestDriveByID":
        if (params.drive_id !== body.drive_id)
          throw new Fault(`The id from the path [${params.drive_id}] does not match the id from the body [${String(body.drive_id)}]!`);
        if (typeof body.path_on_host === "string" && !existsSync(this.host(body.path_on_host))) {
          throw new Fault(
            `Unable to create the block device: BackingFile(Os { code: 2, kind: NotFound, message: "No such file or directory" }, "${body.path_on_host}")`,
          );
        }
        if (body.is_root_device === true && this.config.drives.some((d) => d.is_root_device === true && d.drive_id !== body.drive_id))
          throw new Fault("A root block device already exists!");
        this.configuredSomething = true;
        this.config.drives = [...this.config.drives.filter((d) => d.drive_id !== body.drive_id), body];
        return;
      case "putGuestNetworkInterfaceByID":
        if (params.iface_id !== body.iface_id)
          throw new Fault(`The id from the path [${params.iface_id}] does not match the id from the body [${String(body.iface_id)}]!`);
        this.configuredSomething = true;
        this.config["network-interfaces"] = [...this.config["network-interfaces"].filter((n) => n.iface_id !== body.iface_id), body];
        return;
      case "putGuestVsock":
        this.configuredSomething = true;
        this.config.vsock = body as Config["vsock"];
        return;
      case "createSyncAction":
        return this.action(String(body.action_type));
      case "patchVm":
        if (this.state === "Not started") throw new Fault("The requested operation is not supported before starting the microVM.");
        if (this.behaviour.pauseDelayMs && body.state === "Paused") await sleep(this.behaviour.pauseDelayMs);
        if (body.state === "Paused") this.pause();
        else this.resume();
        return;
      case "createSnapshot":
        return this.createSnapshot(body);
      case "loadSnapshot":
        return this.loadSnapshot(body);
      default:
        throw new Fault(`the fake firecracker does not implement ${operationId}`);
    }
  }

  private async action(type: string): Promise<void> {
    if (type === "FlushMetrics") return;
    if (type === "InstanceStart") {
      if (this.state !== "Not started") throw new Fault("The requested operation is not supported after starting the microVM.");
      if (!this.config["boot-source"]) throw new Fault("Cannot start microvm without kernel configuration.");
      this.state = "Running";
      this.frozenNs = undefined;
      this.clockOffsetNs = 0n;
      await this.startGuest();
      return;
    }
    if (type === "SendCtrlAltDel") {
      if (this.state !== "Running") throw new Fault("The requested operation is not supported before starting the microVM.");
      // The guest reboots; with reboot=k the VMM exits.
      setTimeout(() => this.opts.exit?.(0, "guest rebooted (SendCtrlAltDel)"), 30);
      return;
    }
    throw new Fault(`unknown action ${type}`);
  }

  private pause(): void {
    if (this.state === "Paused") return;
    this.frozenNs = this.guestNowNs();
    this.state = "Paused";
  }

  private resume(): void {
    if (this.state !== "Paused") return;
    this.clockOffsetNs = this.frozenNs! - hostNowNs();
    this.frozenNs = undefined;
    this.state = "Running";
    for (const w of this.resumeWaiters.splice(0)) w();
  }

  private createSnapshot(body: Record<string, unknown>): void {
    if (this.state === "Not started") throw new Fault("The requested operation is not supported before starting the microVM.");
    if (this.state !== "Paused") throw new Fault("Cannot create a snapshot: the microVM is not paused.");
    if (body.snapshot_type === "Diff" && !this.trackDirty) throw new Fault("Diff snapshots are not allowed on uVMs with dirty page tracking disabled.");
    // Virtio vsock: active connections are reset on snapshot (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET).
    for (const c of this.vsockConns) c.destroy();
    const mem: GuestMemory = {
      magic: "fake-fc-mem",
      ...(this.launch ? { launch: this.launch } : {}),
      counter: this.counter,
      leases: this.leases,
      guestClockNs: String(this.frozenNs),
      lastSetNs: String(this.lastSetNs),
      hostAtSnapshotNs: String(hostNowNs()),
      guest: this.guest,
    };
    const memText = JSON.stringify(mem);
    // Padding makes a flipped byte anywhere likely to hit the checksum, not JSON syntax.
    writeFileSync(this.host(String(body.mem_file_path)), memText + " ".repeat(4096 - (memText.length % 4096)));
    const state: StateFile = { magic: "fake-fc-state", version: this.version, config: this.config };
    const stateText = JSON.stringify(state);
    writeFileSync(this.host(String(body.snapshot_path)), `${crc(stateText)}\n${stateText}`);
  }

  private async loadSnapshot(body: Record<string, unknown>): Promise<void> {
    if (this.configuredSomething) throw new Fault("Loading a microVM snapshot not allowed after configuring boot-specific resources.");
    const backend = body.mem_backend as { backend_type: string; backend_path: string } | undefined;
    if ((backend === undefined) === (body.mem_file_path === undefined)) throw new Fault("Exactly one of mem_backend and mem_file_path must be given.");
    if (backend && backend.backend_type !== "File") throw new Fault("the fake firecracker only implements the File memory backend");
    const fatal = (msg: string) => new Fault(`Load snapshot error: ${msg}`, true);
    if (this.behaviour.loadFault) throw fatal(this.behaviour.loadFault);
    const statePath = this.host(String(body.snapshot_path));
    const memPath = this.host(backend ? backend.backend_path : String(body.mem_file_path));
    let state: StateFile;
    let mem: GuestMemory;
    try {
      const text = readFileSync(statePath, "utf8");
      const nl = text.indexOf("\n");
      if (crc(text.slice(nl + 1)) !== text.slice(0, nl)) throw new Error("CRC mismatch in the microVM state file");
      state = JSON.parse(text.slice(nl + 1)) as StateFile;
      mem = JSON.parse(readFileSync(memPath, "utf8")) as GuestMemory;
      if (state.magic !== "fake-fc-state" || mem.magic !== "fake-fc-mem") throw new Error("not a snapshot");
    } catch (err) {
      throw fatal((err as Error).message);
    }
    if (state.version !== this.version) throw fatal(`snapshot version ${state.version} is not supported by ${this.version}`);
    const overrides = (body.network_overrides as { iface_id: string; host_dev_name: string }[] | undefined) ?? [];
    for (const o of overrides) {
      const iface = state.config["network-interfaces"].find((n) => n.iface_id === o.iface_id);
      if (!iface) throw fatal(`network override for unknown interface ${o.iface_id}`);
      iface.host_dev_name = o.host_dev_name;
    }
    if (body.vsock_override && state.config.vsock) state.config.vsock.uds_path = String((body.vsock_override as { uds_path: string }).uds_path);
    // The vsock backend binds its UDS again: a path another VM's socket (the snapshot's source's) holds is refused.
    if (state.config.vsock && existsSync(this.host(state.config.vsock.uds_path))) {
      throw fatal(
        `Cannot restore devices: VsockUnixBackend(UnixBind(Os { code: 98, kind: AddrInUse, message: "Address in use" }), "${state.config.vsock.uds_path}")`,
      );
    }
    // The drives come back from the snapshot: their files are opened again where they were.
    for (const d of state.config.drives) {
      const p = String(d.path_on_host);
      if (!existsSync(this.host(p)))
        throw fatal(`Cannot restore devices: Block(BackingFile(Os { code: 2, kind: NotFound, message: "No such file or directory" }, "${p}"))`);
    }
    this.config = state.config;
    this.configuredSomething = true;
    this.trackDirty = body.track_dirty_pages === true || body.enable_diff_snapshots === true;
    this.restored = true;
    this.launch = mem.launch;
    this.counter = mem.counter;
    this.leases = mem.leases;
    this.lastSetNs = BigInt(mem.lastSetNs);
    this.guest = mem.guest;
    let guestNs = BigInt(mem.guestClockNs);
    if (body.clock_realtime === true && this.behaviour.clockRealtime !== "ignore") guestNs += hostNowNs() - BigInt(mem.hostAtSnapshotNs);
    this.state = "Paused";
    this.frozenNs = guestNs;
    await this.startGuest();
    if (body.resume_vm === true) this.resume();
  }

  // ---- fake guest -------------------------------------------------------------------------------------------

  private guestNowNs(): bigint {
    return this.frozenNs ?? hostNowNs() + this.clockOffsetNs;
  }

  /** Resolves once the VM runs (a paused guest answers nothing). */
  private running(): Promise<void> {
    if (this.state === "Running") return Promise.resolve();
    return new Promise((r) => this.resumeWaiters.push(r));
  }

  private async startGuest(): Promise<void> {
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
      if (this.ended) return;
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

class Fault extends Error {
  readonly fatal: boolean;
  constructor(message: string, fatal = false) {
    super(message);
    this.fatal = fatal;
  }
}

function parseGuestIp(bootArgs: string): string | undefined {
  return /(?:^|\s)ip=([0-9.]+)::/.exec(bootArgs)?.[1];
}

function envOf(spec: LaunchSpec | undefined, key: string): string | undefined {
  return spec?.env.find((e) => e.startsWith(`${key}=`))?.slice(key.length + 1);
}

function now(): number {
  return performance.timeOrigin + performance.now();
}

function hostNowNs(): bigint {
  return BigInt(Date.now()) * 1_000_000n + BigInt(Math.floor((performance.now() % 1) * 1e6));
}

function formatNs(ns: bigint): string {
  return `${ns / 1_000_000_000n}.${(ns % 1_000_000_000n).toString().padStart(9, "0")}`;
}

function crc(text: string): string {
  return createHash("sha256").update(text).digest("hex").slice(0, 16);
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function closeServer(server: HttpServer | NetServer): Promise<void> {
  return new Promise((r) => {
    server.close(() => r());
    (server as HttpServer).closeAllConnections?.();
  });
}
