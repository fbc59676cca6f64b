// A stand-in Firecracker for tests: its HTTP API on a unix socket, enforcing the documented rules and validating
// every request body against firecracker.yaml, plus a tiny fake guest (workload HTTP on the guest IP from the
// kernel `ip=` argument, guest agent behind hybrid vsock, a wall clock that stops while paused/snapshotted).
//
// Rules enforced (Firecracker docs and swagger): pre-boot-only PUTs are refused after InstanceStart; PATCH /vm
// needs a started VM; /snapshot/create needs a Paused VM (Diff needs dirty page tracking); /snapshot/load only
// on a fresh process (nothing configured) and a failed load ends the process; unknown fields and schema
// violations answer 400 `{"fault_message"}`; SendCtrlAltDel with `reboot=k` ends the process. A drive's file must
// exist when it is PUT, and again when a snapshot is loaded (Firecracker reopens the drives the snapshot names).
// A loaded snapshot whose vsock socket path is taken fails (Firecracker binds the UDS again on restore), as does one
// that names a missing drive.
import { existsSync, rmSync } from "node:fs";
import { createServer as createHttpServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from "node:http";
import { join } from "node:path";
import { FakeGuest } from "./firecracker-fake-guest.ts";
import { readSnapshotFiles, writeSnapshotFiles } from "./firecracker-fake-snapshot.ts";
import type { Config, FakeBehaviour, FakeFirecrackerOptions, FakeRequestRecord, GuestMemory, StateFile, VmState } from "./firecracker-fake-types.ts";
import { closeServer, Fault, hostNowNs, isRecord, now, sleep } from "./firecracker-fake-util.ts";

export type { FakeBehaviour, FakeFirecrackerOptions, FakeGuestRecord, FakeRequestRecord } from "./firecracker-fake-types.ts";

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
  private readonly guest: FakeGuest;

  constructor(opts: FakeFirecrackerOptions) {
    this.opts = opts;
    this.behaviour = opts.behaviour ?? {};
    this.version = opts.version ?? "1.10.1";
    this.api = createHttpServer((req, res) => void this.onRequest(req, res));
    this.guest = new FakeGuest(opts, this.behaviour, {
      state: () => this.state,
      config: () => this.config,
      restored: () => this.restored,
      ended: () => this.ended,
      host: (p) => this.host(p),
    });
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
    this.guest.resetConnections();
    await Promise.all([closeServer(this.api), ...this.guest.closeServers()]);
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
      this.guest.boot();
      await this.guest.startGuest();
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
    this.guest.freeze();
    this.state = "Paused";
  }

  private resume(): void {
    if (this.state !== "Paused") return;
    this.state = "Running";
    this.guest.thaw();
  }

  private createSnapshot(body: Record<string, unknown>): void {
    if (this.state === "Not started") throw new Fault("The requested operation is not supported before starting the microVM.");
    if (this.state !== "Paused") throw new Fault("Cannot create a snapshot: the microVM is not paused.");
    if (body.snapshot_type === "Diff" && !this.trackDirty) throw new Fault("Diff snapshots are not allowed on uVMs with dirty page tracking disabled.");
    // Virtio vsock: active connections are reset on snapshot (VIRTIO_VSOCK_EVENT_TRANSPORT_RESET).
    this.guest.resetConnections();
    const state: StateFile = { magic: "fake-fc-state", version: this.version, config: this.config };
    writeSnapshotFiles(this.host(String(body.mem_file_path)), this.host(String(body.snapshot_path)), this.guest.memory(), state);
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
      ({ state, mem } = readSnapshotFiles(statePath, memPath));
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
    let guestNs = BigInt(mem.guestClockNs);
    if (body.clock_realtime === true && this.behaviour.clockRealtime !== "ignore") guestNs += hostNowNs() - BigInt(mem.hostAtSnapshotNs);
    this.state = "Paused";
    this.guest.restore(mem, guestNs);
    await this.guest.startGuest();
    if (body.resume_vm === true) this.resume();
  }
}
