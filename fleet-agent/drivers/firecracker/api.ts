// Typed client for Firecracker's HTTP API over its unix socket (the subset the firecracker driver uses).
//
// Bodies follow the definitions in Firecracker's swagger (`firecracker.yaml`); Firecracker refuses unknown
// fields, so optional fields are only ever set when the caller means them. Errors answer `{"fault_message"}`
// and surface here as `FirecrackerApiError` carrying that message.
import { Client } from "undici";

export interface BootSource {
  kernel_image_path: string;
  initrd_path?: string;
  boot_args?: string;
}

export interface Drive {
  drive_id: string;
  is_root_device: boolean;
  path_on_host?: string;
  is_read_only?: boolean;
  partuuid?: string;
  cache_type?: "Unsafe" | "Writeback";
  io_engine?: "Sync" | "Async";
}

export interface MachineConfiguration {
  vcpu_count: number;
  mem_size_mib: number;
  smt?: boolean;
  track_dirty_pages?: boolean;
  huge_pages?: "None" | "Transparent" | "2M";
}

export interface NetworkInterface {
  iface_id: string;
  host_dev_name: string;
  guest_mac?: string;
  mtu?: number;
}

export interface Vsock {
  guest_cid: number;
  uds_path: string;
}

export type InstanceAction = "InstanceStart" | "SendCtrlAltDel" | "FlushMetrics";

export interface SnapshotCreateParams {
  snapshot_path: string;
  mem_file_path: string;
  snapshot_type?: "Full" | "Diff";
}

export interface MemoryBackend {
  backend_type: "File" | "Uffd";
  backend_path: string;
}

export interface NetworkOverride {
  iface_id: string;
  host_dev_name: string;
}

export interface SnapshotLoadParams {
  snapshot_path: string;
  mem_backend: MemoryBackend;
  resume_vm?: boolean;
  track_dirty_pages?: boolean;
  network_overrides?: NetworkOverride[];
  vsock_override?: { uds_path: string };
  /** x86_64 only: advance kvmclock by the wall-clock time since the snapshot (KVM_CLOCK_REALTIME). */
  clock_realtime?: boolean;
}

export interface InstanceInfo {
  app_name: string;
  id: string;
  state: "Not started" | "Running" | "Paused";
  vmm_version: string;
}

export interface FullVmConfiguration {
  "boot-source"?: BootSource;
  "machine-config"?: MachineConfiguration;
  drives?: Drive[];
  "network-interfaces"?: NetworkInterface[];
  vsock?: Vsock;
  [key: string]: unknown;
}

/** Firecracker answered an API call with an error status; `faultMessage` is its own explanation. */
export class FirecrackerApiError extends Error {
  override name = "FirecrackerApiError";
  readonly status: number;
  readonly faultMessage: string;
  readonly method: string;
  readonly path: string;

  constructor(method: string, path: string, status: number, faultMessage: string) {
    super(`firecracker ${method} ${path} → ${status}: ${faultMessage}`);
    this.method = method;
    this.path = path;
    this.status = status;
    this.faultMessage = faultMessage;
  }
}

/** The API socket did not answer at all (process gone, socket missing, timeout). */
export class FirecrackerUnreachableError extends Error {
  override name = "FirecrackerUnreachableError";
}

export interface FirecrackerClientOptions {
  /** Default per-request timeout; snapshot calls take their own (they write the guest memory). */
  timeoutMs?: number;
  snapshotTimeoutMs?: number;
}

export class FirecrackerClient {
  readonly socketPath: string;
  private readonly client: Client;
  private readonly timeoutMs: number;
  private readonly snapshotTimeoutMs: number;

  constructor(socketPath: string, opts: FirecrackerClientOptions = {}) {
    this.socketPath = socketPath;
    // A Client is one connection: Firecracker's API server handles one request at a time anyway.
    this.client = new Client("http://localhost", { socketPath, pipelining: 1 });
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.snapshotTimeoutMs = opts.snapshotTimeoutMs ?? 300_000;
  }

  describeInstance(): Promise<InstanceInfo> {
    return this.call<InstanceInfo>("GET", "/");
  }

  async version(): Promise<string> {
    return (await this.call<{ firecracker_version: string }>("GET", "/version")).firecracker_version;
  }

  vmConfig(): Promise<FullVmConfiguration> {
    return this.call<FullVmConfiguration>("GET", "/vm/config");
  }

  putBootSource(body: BootSource): Promise<void> {
    return this.call("PUT", "/boot-source", body);
  }

  putDrive(body: Drive): Promise<void> {
    return this.call("PUT", `/drives/${encodeURIComponent(body.drive_id)}`, body);
  }

  putMachineConfig(body: MachineConfiguration): Promise<void> {
    return this.call("PUT", "/machine-config", body);
  }

  putNetworkInterface(body: NetworkInterface): Promise<void> {
    return this.call("PUT", `/network-interfaces/${encodeURIComponent(body.iface_id)}`, body);
  }

  putVsock(body: Vsock): Promise<void> {
    return this.call("PUT", "/vsock", body);
  }

  action(action_type: InstanceAction): Promise<void> {
    return this.call("PUT", "/actions", { action_type });
  }

  pause(): Promise<void> {
    return this.call("PATCH", "/vm", { state: "Paused" });
  }

  resume(): Promise<void> {
    return this.call("PATCH", "/vm", { state: "Resumed" });
  }

  createSnapshot(body: SnapshotCreateParams): Promise<void> {
    return this.call("PUT", "/snapshot/create", body, this.snapshotTimeoutMs);
  }

  loadSnapshot(body: SnapshotLoadParams): Promise<void> {
    return this.call("PUT", "/snapshot/load", body, this.snapshotTimeoutMs);
  }

  async close(): Promise<void> {
    await this.client.destroy().catch(() => {});
  }

  private async call<T = void>(method: "GET" | "PUT" | "PATCH", path: string, body?: unknown, timeoutMs = this.timeoutMs): Promise<T> {
    let res;
    try {
      res = await this.client.request({
        method,
        path,
        headers: body === undefined ? { accept: "application/json" } : { accept: "application/json", "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
    } catch (err) {
      throw new FirecrackerUnreachableError(`firecracker ${method} ${path} failed on ${this.socketPath}: ${(err as Error).message}`, { cause: err });
    }
    const text = await res.body.text();
    if (res.statusCode >= 300) throw new FirecrackerApiError(method, path, res.statusCode, faultMessageOf(text));
    if (res.statusCode === 204 || text === "") return undefined as T;
    return JSON.parse(text) as T;
  }
}

function faultMessageOf(text: string): string {
  try {
    const parsed = JSON.parse(text) as { fault_message?: unknown };
    if (typeof parsed.fault_message === "string") return parsed.fault_message;
  } catch {
    /* not JSON: fall through to the raw text */
  }
  return text.trim() || "(no fault message)";
}
