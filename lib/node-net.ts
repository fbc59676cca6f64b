// Small networking facts on Node: a loopback port nobody listens on yet; how to reach a VM's port (TCP or a unix socket).
import { createServer } from "node:net";

/** A loopback port free right now (the OS picks it). */
export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => (port ? resolve(port) : reject(new Error("no port"))));
    });
  });
}

/**
 * Where a VM's port is reached from the host: TCP at `host:port`, or, with `socketPath`, a unix socket only root may
 * use (a QEMU in a network namespace of its own, its port relayed: fleet-agent/drivers/common/exec-stub.c); `host:port`
 * then only names the port (an HTTP Host header).
 */
export interface PortEndpoint {
  host: string;
  port: number;
  socketPath?: string | undefined;
}

/** `net.connect` options for `ep`. */
export function connectOptions(ep: PortEndpoint): { path: string } | { host: string; port: number } {
  return ep.socketPath ? { path: ep.socketPath } : { host: ep.host, port: ep.port };
}

/** `http.request` options for `ep` (its Host header stays `host:port`). */
export function requestOptions(ep: PortEndpoint): { host: string; port: number; socketPath?: string } {
  return ep.socketPath ? { host: ep.host, port: ep.port, socketPath: ep.socketPath } : { host: ep.host, port: ep.port };
}

/** `ep` in a message. */
export function endpointLabel(ep: PortEndpoint): string {
  return ep.socketPath ? `unix:${ep.socketPath}` : `${ep.host}:${ep.port}`;
}
