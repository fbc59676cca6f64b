// The fake Firecracker's small helpers: its fault answers, clocks in ns, the state file checksum, server closing.
import { createHash } from "node:crypto";
import type { Server as HttpServer } from "node:http";
import type { Server as NetServer } from "node:net";
import type { LaunchSpec } from "../../fleet-agent/guest/launch-spec.ts";
export class Fault extends Error {
  readonly fatal: boolean;
  constructor(message: string, fatal = false) {
    super(message);
    this.fatal = fatal;
  }
}

export function parseGuestIp(bootArgs: string): string | undefined {
  return /(?:^|\s)ip=([0-9.]+)::/.exec(bootArgs)?.[1];
}

export function envOf(spec: LaunchSpec | undefined, key: string): string | undefined {
  return spec?.env.find((e) => e.startsWith(`${key}=`))?.slice(key.length + 1);
}

export function now(): number {
  return performance.timeOrigin + performance.now();
}

export function hostNowNs(): bigint {
  return BigInt(Date.now()) * 1_000_000n + BigInt(Math.floor((performance.now() % 1) * 1e6));
}

export function formatNs(ns: bigint): string {
  return `${ns / 1_000_000_000n}.${(ns % 1_000_000_000n).toString().padStart(9, "0")}`;
}

export function crc(text: string): string {
  return createHash("sha256").update(text).digest("hex").slice(0, 16);
}

export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function closeServer(server: HttpServer | NetServer): Promise<void> {
  return new Promise((r) => {
    server.close(() => r());
    (server as HttpServer).closeAllConnections?.();
  });
}
