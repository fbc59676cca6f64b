// bench:proxy's floor for a proxy written on Node: a bare TCP relay, one upstream connection per client connection, bytes passed on unread.
//
// No HTTP parsing, no header rewriting, no routing, no auth: what any Node proxy pays at least for the same four
// socket operations per call (two reads, two writes) through libuv and Node's stream layer. A gateway cannot cost
// less CPU per call than this; nginx's CPU per call beside it says what is left to win in JavaScript at all.
// Usage: node scripts/bench/byte-relay.ts LISTEN_PORT UPSTREAM_PORT
import { connect, createServer, type Socket } from "node:net";

const [listenPort, upstreamPort] = process.argv.slice(2).map(Number);
if (!listenPort || !upstreamPort) throw new Error("usage: byte-relay.ts LISTEN_PORT UPSTREAM_PORT");

function relay(from: Socket, to: Socket): void {
  from.on("data", (chunk: Buffer) => {
    if (!to.write(chunk)) from.pause();
  });
  to.on("drain", () => from.resume());
  from.on("end", () => to.end());
  from.on("error", () => to.destroy());
  from.on("close", () => to.destroy());
}

const server = createServer({ noDelay: true }, (client) => {
  const upstream = connect({ port: upstreamPort, host: "127.0.0.1", noDelay: true });
  relay(client, upstream);
  relay(upstream, client);
});
server.listen(listenPort, "127.0.0.1");
process.on("SIGINT", () => server.close(() => process.exit(0)));
