// The example agent: a plain node:http server showing what survives hibernation (memory, the workspace disk) and what keeps a VM awake (leases).
"use strict";
const http = require("node:http");
const fs = require("node:fs");
const path = require("node:path");

const port = Number(process.env.PORT || 8080);
const agentId = process.env.AGENT_ID || "unknown";
const leaseDir = process.env.LEASE_DIR || "/run/agentvm/leases";
const workspace = process.env.WORKSPACE_DIR || "/workspace"; // on the agent's persistent disk
const started = Date.now();
let counter = 0; // in memory only: a woken VM still has it, a cold boot starts again at 0
const jobs = new Map();
let nextJob = 1;

function json(res, status, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

function fileName(name) {
  const decoded = decodeURIComponent(name);
  if (!decoded || decoded.includes("/") || decoded === "." || decoded === "..") return undefined;
  return path.join(workspace, decoded);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/** A background job holds a lease (a file whose content is its expiry in unix seconds) while it runs. */
function startJob(ms) {
  const id = nextJob++;
  const lease = path.join(leaseDir, `job-${id}`);
  fs.mkdirSync(leaseDir, { recursive: true });
  fs.writeFileSync(lease, String(Math.ceil((Date.now() + ms) / 1000) + 5));
  const job = { id, ms, startedAt: new Date().toISOString(), done: false };
  jobs.set(id, job);
  setTimeout(() => {
    job.done = true;
    job.finishedAt = new Date().toISOString();
    fs.rmSync(lease, { force: true });
  }, ms);
  return job;
}

async function handle(req, res, url) {
  const route = `${req.method} ${url.pathname}`;
  if (route === "GET /") return json(res, 200, { agentId, uptimeS: Math.round((Date.now() - started) / 1000), node: process.version });
  if (route === "GET /counter") return json(res, 200, { counter: ++counter });
  if (route === "GET /tokens") {
    const n = Math.min(Number(url.searchParams.get("n") || 20), 10000);
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    let i = 0;
    const timer = setInterval(() => {
      if (i >= n) {
        clearInterval(timer);
        res.end("event: done\ndata: {}\n\n");
        return;
      }
      res.write(`data: ${JSON.stringify({ i, token: `token-${i}` })}\n\n`);
      i++;
    }, 50);
    req.on("close", () => clearInterval(timer));
    return;
  }
  if (url.pathname.startsWith("/files/")) {
    const file = fileName(url.pathname.slice("/files/".length));
    if (!file) return json(res, 400, { error: "bad file name" });
    if (req.method === "PUT") {
      fs.mkdirSync(workspace, { recursive: true });
      const body = await readBody(req);
      fs.writeFileSync(file, body);
      return json(res, 201, { name: path.basename(file), bytes: body.length });
    }
    if (req.method === "GET") {
      if (!fs.existsSync(file)) return json(res, 404, { error: "no such file" });
      const data = fs.readFileSync(file);
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": data.length });
      return res.end(data);
    }
  }
  if (route === "POST /fill") {
    const mib = Number(url.searchParams.get("mib") || 1);
    const chunk = Buffer.alloc(1 << 20, 0x61);
    let fd;
    try {
      fd = fs.openSync(path.join(workspace, "fill.bin"), "w");
      for (let i = 0; i < mib; i++) fs.writeSync(fd, chunk);
      fs.fsyncSync(fd);
      return json(res, 200, { mib });
    } catch (err) {
      return json(res, 507, { error: err.code || String(err) });
    } finally {
      if (fd !== undefined) fs.closeSync(fd);
    }
  }
  if (route === "POST /jobs") return json(res, 202, startJob(Math.max(1, Number(url.searchParams.get("ms") || 1000))));
  if (route === "GET /jobs") return json(res, 200, { jobs: [...jobs.values()] });
  return json(res, 404, { error: `no route ${route}` });
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, "http://agent");
  const t0 = Date.now();
  res.on("finish", () => console.log(`${new Date().toISOString()} ${req.method} ${url.pathname}${url.search} ${res.statusCode} ${Date.now() - t0}ms`));
  handle(req, res, url).catch((err) => {
    console.error(err);
    if (!res.headersSent) json(res, 500, { error: err.code || String(err) });
    else res.destroy();
  });
});

server.listen(port, "0.0.0.0", () => console.log(`node-agent ${agentId} listening on :${port}`));
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => server.close(() => process.exit(0)));
