// A test workload: answers every request with what it received (method, path, headers, body size), and can crash.
import { createServer } from "node:http";

let aborted = 0;
const server = createServer((req, res) => {
  if (req.url === "/crash") process.exit(3);
  if (req.url === "/aborted") return void res.end(JSON.stringify({ aborted }));
  if (req.url?.startsWith("/hang")) {
    req.on("close", () => {
      if (!res.writableEnded) aborted++;
    });
    return;
  }
  let bytes = 0;
  req.on("data", (c: Buffer) => (bytes += c.length));
  req.on("end", () => {
    res.writeHead(200, { "content-type": "application/json", connection: "keep-alive", "x-custom": "yes" });
    res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers, bytes }));
  });
});
server.listen(Number(process.env.PORT), "127.0.0.1");
