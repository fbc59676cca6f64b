// `npm run logs -- <agentId> [--follow] [--tail BYTES]`: prints an agent's log as the gateway at AGENTVM_URL streams it (token in AGENTVM_TOKEN); Ctrl-C ends a follow.
import { parseArgs } from "node:util";

const usage =
  "usage: npm run logs -- <agentId> [--follow|-f] [--tail BYTES]   (AGENTVM_URL, default http://127.0.0.1:8080; AGENTVM_TOKEN, a token with agents:admin)";

function die(message: string, code = 2): never {
  console.error(`logs: ${message}`);
  process.exit(code);
}

let parsed;
try {
  parsed = parseArgs({
    allowPositionals: true,
    options: { follow: { type: "boolean", short: "f", default: false }, tail: { type: "string" }, help: { type: "boolean", short: "h" } },
  });
} catch (err) {
  die(`${(err as Error).message}\n${usage}`);
}
const { values, positionals } = parsed;
if (values.help) {
  console.log(usage);
  process.exit(0);
}
const agentId = positionals[0];
if (!agentId || positionals.length > 1) die(usage);
if (values.tail !== undefined && !/^\d+$/.test(values.tail)) die("--tail must be a number of bytes");
const base = (process.env.AGENTVM_URL || "http://127.0.0.1:8080").replace(/\/+$/, "");
const token = process.env.AGENTVM_TOKEN;
if (!token)
  die("AGENTVM_TOKEN is not set. `npm start` prints a token for its demo tenant; mint others with `npm run token -- --tenant <tenant> --scopes agents:admin`");

const url = new URL(`${base}/v1/agents/${encodeURIComponent(agentId)}/logs`);
if (values.tail !== undefined) url.searchParams.set("tail", values.tail);
if (values.follow) url.searchParams.set("follow", "true");

// Ctrl-C (or SIGTERM) ends a follow: that is how one is meant to end, so it is a success.
const abort = new AbortController();
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    abort.abort();
    process.exit(0);
  });
}
// A reader that went away (`| head`) is no error either.
process.stdout.on("error", (err: NodeJS.ErrnoException) => process.exit(err.code === "EPIPE" ? 0 : 1));

let res: Response;
try {
  res = await fetch(url, { headers: { authorization: `Bearer ${token}`, accept: "text/plain" }, signal: abort.signal });
} catch (err) {
  const cause = (err as Error).cause instanceof Error ? `: ${((err as Error).cause as Error).message}` : "";
  die(`cannot reach the gateway at ${base} (${(err as Error).message}${cause})`, 1);
}
if (!res.ok) {
  const text = await res.text();
  let message = text.slice(0, 500);
  try {
    const body = JSON.parse(text) as { error?: { code?: string; message?: string } };
    if (body.error?.message) message = `${body.error.code}: ${body.error.message}`;
  } catch {
    /* not the error envelope: its text says it */
  }
  die(`${res.status} ${message}`, 1);
}

for await (const chunk of res.body ?? []) {
  if (!process.stdout.write(chunk)) await new Promise((resolve) => process.stdout.once("drain", resolve));
}
if (values.follow) console.error("logs: the gateway ended the stream");
