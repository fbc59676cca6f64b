// The fake Firecracker's types: how a test shapes and observes it, and the formats of its snapshot files and guest memory.
import type { LaunchSpec } from "../../fleet-agent/guest/launch-spec.ts";
import type { FirecrackerSpec } from "./firecracker-spec.ts";

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
  /** The guest predates exec: EXECKEY is an unknown command. */
  noExec?: boolean;
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

export type VmState = "Not started" | "Running" | "Paused";

export interface GuestMemory {
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
export interface GuestIdentityState {
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

export interface StateFile {
  magic: "fake-fc-state";
  version: string;
  config: Config;
}

export interface Config {
  "machine-config"?: Record<string, unknown>;
  "boot-source"?: Record<string, unknown>;
  drives: Record<string, unknown>[];
  "network-interfaces": Record<string, unknown>[];
  vsock?: { guest_cid: number; uds_path: string };
}
