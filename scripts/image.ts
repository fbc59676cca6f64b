// Image CLI over the API: `npm run image -- build <dir> --name n`, `import <archive> --name n`, `ls`, `rm <id>`, `log <buildId>` (packing and build events shared with `agentvm images`).
import { existsSync, statSync } from "node:fs";
import { parseArgs } from "node:util";
import { buildEventText, fileStream, mib, ndjson, tarDirectory, type BuildStreamEvent } from "../cli/image-upload.ts";

const help = `usage: npm run image -- <command> [options]

  build <dir> --name NAME [--tag TAG] [--file Containerfile]   build from a directory holding a Containerfile or Dockerfile
  import <archive> --name NAME [--tag TAG]                     import an OCI archive or a docker save tarball
  ls                                                           list this tenant's images
  rm <imageId>                                                 delete an image (409 while an agent runs it)
  log <buildId> [--follow]                                     a build's log

  --url     gateway base URL (default $AGENTVM_URL or http://127.0.0.1:8080)
  --token   bearer token with agents:admin (default $AGENTVM_TOKEN)`;

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    name: { type: "string" },
    tag: { type: "string", default: "latest" },
    file: { type: "string" },
    follow: { type: "boolean", default: false },
    url: { type: "string", default: process.env.AGENTVM_URL ?? "http://127.0.0.1:8080" },
    token: { type: "string", default: process.env.AGENTVM_TOKEN },
    help: { type: "boolean", short: "h", default: false },
  },
});

function die(message: string, code = 2): never {
  console.error(`image: ${message}`);
  process.exit(code);
}

const [command, arg] = positionals;
if (values.help || !command) {
  console.log(help);
  process.exit(values.help ? 0 : 2);
}
if (!values.token) die("no token: pass --token or set AGENTVM_TOKEN (npm start prints one)");
const base = values.url.replace(/\/+$/, "");
const headers = { authorization: `Bearer ${values.token}` };

async function failIfError(res: Response): Promise<void> {
  if (res.ok) return;
  const text = await res.text();
  let message = text;
  try {
    const body = JSON.parse(text) as { error?: { code: string; message: string; requestId?: string } };
    if (body.error) message = `${body.error.code}: ${body.error.message}${body.error.requestId ? ` (request ${body.error.requestId})` : ""}`;
  } catch {
    // not the error envelope: print as is
  }
  die(`${res.status} ${message}`, 1);
}

/** Streams the upload and prints the build's events as they come; exits non-zero on a failed build. */
async function upload(body: ReadableStream<Uint8Array>, kind: "containerfile" | "archive"): Promise<void> {
  if (!values.name) die("--name is required");
  const q = new URLSearchParams({ name: values.name, tag: values.tag, kind, ...(values.file ? { file: values.file } : {}) });
  const started = performance.now();
  const res = await fetch(`${base}/v1/images?${q}`, {
    method: "POST",
    headers: { ...headers, "content-type": "application/x-tar", accept: "application/x-ndjson" },
    body,
    duplex: "half",
  } as RequestInit);
  await failIfError(res);
  for await (const { value } of ndjson<BuildStreamEvent>(res.body!)) show(value, started);
}

function show(e: BuildStreamEvent, started: number): void {
  switch (e.type) {
    case "build":
      return console.log(`build ${e.build.id}`);
    case "image":
      return console.log(
        `image ${e.image.id} ${e.image.name}:${e.image.tag} ${e.image.digest} ${mib(e.image.sizeBytes)} in ${((performance.now() - started) / 1000).toFixed(1)} s`,
      );
    case "error":
      return die(`${e.error.code}: ${e.error.message} (request ${e.error.requestId})`, 1);
    default:
      return console.log(buildEventText(e));
  }
}

switch (command) {
  case "build": {
    if (!arg || !existsSync(arg) || !statSync(arg).isDirectory()) die("build needs a directory (the build context)");
    await upload(tarDirectory(arg), "containerfile");
    break;
  }
  case "import": {
    if (!arg || !existsSync(arg)) die("import needs an archive file");
    await upload(fileStream(arg), "archive");
    break;
  }
  case "ls": {
    const res = await fetch(`${base}/v1/images`, { headers });
    await failIfError(res);
    const { images } = (await res.json()) as { images: { id: string; name: string; tag: string; digest: string; sizeBytes: number; createdAt: string }[] };
    for (const i of images)
      console.log(`${i.id}  ${`${i.name}:${i.tag}`.padEnd(32)}  ${i.digest.slice(0, 19)}  ${mib(i.sizeBytes).padStart(10)}  ${i.createdAt}`);
    break;
  }
  case "rm": {
    if (!arg) die("rm needs an image id");
    const res = await fetch(`${base}/v1/images/${encodeURIComponent(arg)}`, { method: "DELETE", headers });
    await failIfError(res);
    console.log(`deleted ${arg}`);
    break;
  }
  case "log": {
    if (!arg) die("log needs a build id");
    const res = await fetch(`${base}/v1/images/builds/${encodeURIComponent(arg)}/log${values.follow ? "?follow=true" : ""}`, { headers });
    await failIfError(res);
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) process.stdout.write(chunk);
    break;
  }
  default:
    die(`unknown command ${command}\n${help}`);
}
