// Node entry of the gateway: serves the Hono app with @hono/node-server. Adapts only; no logic lives here.
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { getConnInfo } from "@hono/node-server/conninfo";
import type { Context, Hono } from "hono";
import type { GatewayEnv } from "./auth-context.ts";

export const nodeClientIp = (c: Context<GatewayEnv>): string | undefined => getConnInfo(c).remote.address;

export interface NodeServer {
  server: Server;
  port: number;
  /** Stops accepting connections and ends idle kept-alive ones; in-flight requests finish. */
  close(): Promise<void>;
}

export function serveNode(app: Hono<GatewayEnv>, opts: { port: number; hostname?: string }): Promise<NodeServer> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch: app.fetch, port: opts.port, hostname: opts.hostname ?? "0.0.0.0" }, (info: AddressInfo) => {
      resolve({
        server,
        port: info.port,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeIdleConnections();
          }),
      });
    }) as Server;
    server.once("error", reject);
    // No total request timeout: long streams are bounded by idle rules, not by the server.
    server.requestTimeout = 0;
    server.headersTimeout = 30_000;
  });
}
