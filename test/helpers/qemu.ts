// Test helpers for the qemu driver: the guest image, VM specs in temp stateDirs, a driver, small HTTP calls;
// run as a script it is the child process the kill -9 test shoots mid-snapshot.
import { mkdtempSync } from "node:fs";
import { Agent, fetch as undiciFetch } from "undici";
import type { PortEndpoint } from "../../lib/node-net.ts";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { ensureGuestImage, type GuestImage } from "../../fleet-agent/guest/build-image.ts";
import { createLogger, silentLogger } from "../../lib/log.ts";
import type { VmSpec } from "../../fleet-agent/drivers/driver.ts";
import { QemuDriver, type QemuDriverOptions } from "../../fleet-agent/drivers/qemu/driver.ts";
import type { Accel } from "../../fleet-agent/drivers/qemu/args.ts";

/** QEMU_ACCEL=tcg|kvm forces an accelerator for a run of the suite; default auto. */
export function testAccel(): Accel | "auto" {
  const v = process.env.QEMU_ACCEL;
  return v === "kvm" || v === "tcg" ? v : "auto";
}

let imagePromise: Promise<GuestImage> | undefined;

/** The guest image from the repo's data dir (or DATA_DIR), built on first use. */
export function guestImage(): Promise<GuestImage> {
  imagePromise ??= ensureGuestImage({ dataDir: resolve(process.env.DATA_DIR ?? join(import.meta.dirname, "..", "..", ".data")), log: () => {} });
  return imagePromise;
}

export async function makeDriver(opts: Partial<QemuDriverOptions> = {}): Promise<QemuDriver> {
  const image = await guestImage();
  const log = process.env.QEMU_TEST_LOG ? createLogger({ level: "debug" }) : silentLogger;
  return new QemuDriver({ image, accel: testAccel(), log, ...opts });
}

let seq = 0;

/** A VM spec in a fresh temp stateDir (short path: it holds unix sockets). */
export function makeSpec(overrides: Partial<VmSpec> = {}): VmSpec {
  const stateDir = overrides.stateDir ?? mkdtempSync(join(tmpdir(), "qemu-vm-"));
  seq++;
  return { vmId: `vm_test${process.pid}x${seq}`, agentId: `agt_test${seq}`, image: "demo", vcpus: 1, memMiB: 256, allowEgress: false, stateDir, ...overrides };
}

export interface HttpAnswer {
  status: number;
  headers: Headers;
  text: string;
}

const socketAgents = new Map<string, Agent>();

/**
 * fetch at a VM endpoint (a loopback port, or a QEMU's relayed unix socket: then `host:port` only names it). Calls
 * through the gateway are what clients make; the tests that drive a driver alone call its VM here.
 */
export function fetchAt(ep: number | PortEndpoint, path: string, init: RequestInit = {}): Promise<Response> {
  const e = typeof ep === "number" ? { host: "127.0.0.1", port: ep } : ep;
  const signal = init.signal ?? AbortSignal.timeout(30_000);
  if (!e.socketPath) return fetch(`http://${e.host}:${e.port}${path}`, { ...init, signal });
  let dispatcher = socketAgents.get(e.socketPath);
  if (!dispatcher) socketAgents.set(e.socketPath, (dispatcher = new Agent({ connect: { socketPath: e.socketPath } })));
  return undiciFetch(`http://${e.host}:${e.port}${path}`, { ...(init as object), signal, dispatcher }) as unknown as Promise<Response>;
}

/** One HTTP call to a VM endpoint. */
export async function call(ep: number | PortEndpoint, path: string, init: RequestInit = {}): Promise<HttpAnswer> {
  const res = await fetchAt(ep, path, init);
  return { status: res.status, headers: res.headers as Headers, text: await res.text() };
}

export async function json<T>(port: number | PortEndpoint, path: string, init: RequestInit = {}): Promise<T> {
  const r = await call(port, path, init);
  if (r.status >= 300) throw new Error(`${path} answered ${r.status}: ${r.text}`);
  return JSON.parse(r.text) as T;
}

/**
 * Child mode for the crash test: boots, counts to 1, hibernates (a complete snapshot), wakes, counts
 * to 2, then starts a second hibernation and reports every step on stdout as JSON lines; the parent
 * kills it with SIGKILL once the snapshot is being written.
 */
async function childMain(stateDir: string, vmId: string): Promise<void> {
  const say = (o: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(o)}\n`);
  const driver = await makeDriver();
  const spec = makeSpec({ stateDir, vmId });
  const { vm } = await driver.boot(spec);
  await json(vm.endpoint, "/counter", { method: "POST" });
  const first = await driver.hibernate(vm);
  say({ step: "hibernated", completed: first.completed });
  const woke = await driver.wake(spec);
  const { count } = await json<{ count: number }>(woke.vm.endpoint, "/counter", { method: "POST" });
  say({ step: "hibernating", count, pid: woke.vm.pid });
  await driver.hibernate(woke.vm);
  say({ step: "finished" });
}

if (import.meta.main) {
  const [mode, stateDir, vmId] = process.argv.slice(2);
  if (mode !== "crash-child" || !stateDir || !vmId) {
    console.error("usage: node test/helpers/qemu.ts crash-child <stateDir> <vmId>");
    process.exit(2);
  }
  await childMain(stateDir, vmId);
}
