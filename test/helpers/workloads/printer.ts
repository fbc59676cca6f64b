// A test workload that writes to its log on request: what the agent-log tests read back.
//   POST /print?text=T[&stream=stderr]    writes the line T (to stdout, or stderr)
//   POST /print?lines=N[&width=W][&from=K] writes N numbered lines "line <K+i> xxx…" of W bytes each (W ≥ 16)
//   GET /                                  ok
import { createServer } from "node:http";

const port = Number(process.env.PORT);

const server = createServer((req, res) => {
  const url = new URL(req.url ?? "/", "http://x");
  if (req.method === "POST" && url.pathname === "/print") {
    const out = url.searchParams.get("stream") === "stderr" ? process.stderr : process.stdout;
    const text = url.searchParams.get("text");
    if (text !== null) out.write(`${text}\n`);
    const n = Number(url.searchParams.get("lines") ?? 0);
    const width = Math.max(16, Number(url.searchParams.get("width") ?? 64));
    const from = Number(url.searchParams.get("from") ?? 1);
    let chunk = "";
    for (let i = 0; i < n; i++) {
      const head = `line ${from + i} `;
      chunk += `${head + "x".repeat(width - head.length - 1)}\n`;
      if (chunk.length > 1 << 20) {
        out.write(chunk);
        chunk = "";
      }
    }
    if (chunk) out.write(chunk);
    return void res.end("printed\n");
  }
  res.end("ok\n");
});
server.listen(port, "127.0.0.1", () => console.log(`printer listening on 127.0.0.1:${port}`));
