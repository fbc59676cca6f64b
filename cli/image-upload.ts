// What an image upload needs on the client side: a build context packed as a tar, and the build's NDJSON events read and told.
import { spawn } from "node:child_process";
import { createReadStream } from "node:fs";
import { Readable } from "node:stream";
import type { ImageBuildEvent } from "../images/builds.ts";
import { usageError } from "./exit.ts";

/** A line of `POST /v1/images`'s NDJSON answer: the build's id first, its events, its image or error last. */
export type BuildStreamEvent =
  | ImageBuildEvent
  | { type: "build"; build: { id: string } }
  | { type: "image"; image: { id: string; name: string; tag: string; digest: string; sizeBytes: number } }
  | { type: "error"; error: { code: string; message: string; requestId: string } };

export const mib = (bytes: number) => `${(bytes / 1024 ** 2).toFixed(1)} MiB`;

/**
 * The directory as a tar stream (`tar -c -C DIR .`, the build context the API takes); the stream errors when tar
 * fails, so an unreadable context fails the upload rather than building half of it.
 */
export function tarDirectory(dir: string): ReadableStream<Uint8Array> {
  const tar = spawn("tar", ["-c", "-C", dir, "."], { stdio: ["ignore", "pipe", "inherit"] });
  const out = tar.stdout;
  tar.on("error", (err) => out.destroy(err));
  tar.on("exit", (code, signal) => {
    if (code !== 0) out.destroy(new Error(`tar of ${dir} failed (${signal ?? `exit ${code}`})`));
  });
  return Readable.toWeb(out) as ReadableStream<Uint8Array>;
}

/** A file (an image archive) as a stream. */
export function fileStream(path: string): ReadableStream<Uint8Array> {
  return Readable.toWeb(createReadStream(path)) as ReadableStream<Uint8Array>;
}

/** The JSON objects of an NDJSON body, one a line, as they arrive. */
export async function* ndjson<T>(body: ReadableStream<Uint8Array>): AsyncGenerator<{ value: T; line: string }> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl).trim();
      buffer = buffer.slice(nl + 1);
      if (line) yield { value: JSON.parse(line) as T, line };
    }
  }
  const rest = (buffer + decoder.decode()).trim();
  if (rest) yield { value: JSON.parse(rest) as T, line: rest };
}

/** A build event as a line a person reads: `STEP 2/5: RUN …`, `  <log line>`, `[export] (12.0 MiB)`. */
export function buildEventText(e: ImageBuildEvent): string {
  switch (e.type) {
    case "step":
      return `STEP ${e.step}/${e.total}: ${e.text}`;
    case "log":
      return `  ${e.line}`;
    case "progress":
      return `[${e.phase}]${e.text ? ` ${e.text}` : ""}${e.bytes !== undefined ? ` (${mib(e.bytes)})` : ""}`;
  }
}

const namePattern = /^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$/;

/** `name[:tag]` → its parts (tag `latest` when absent); without one, a name made from `fallback` (a directory's or file's name). */
export function imageName(raw: string | undefined, fallback: string): { name: string; tag: string } {
  if (raw === undefined) {
    const made = fallback
      .toLowerCase()
      .replace(/\.(tar|tgz|tar\.gz|oci|docker)$/g, "")
      .replace(/[^a-z0-9._-]+/g, "-")
      .replace(/^[._-]+|[._-]+$/g, "");
    if (!namePattern.test(made)) throw usageError(`cannot make an image name of "${fallback}": pass --name name[:tag]`);
    return { name: made, tag: "latest" };
  }
  const colon = raw.lastIndexOf(":");
  const [name, tag] = colon > raw.lastIndexOf("/") ? [raw.slice(0, colon), raw.slice(colon + 1)] : [raw, "latest"];
  if (!namePattern.test(name) || !tag)
    throw usageError(`--name: "${raw}" is not name[:tag] (lowercase letters, digits and . _ - separators, optionally with /)`);
  return { name, tag };
}
