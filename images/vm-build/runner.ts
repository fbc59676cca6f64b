// Runs a tenant's Containerfile build inside the tenant's builder agent (a microVM): the context and our bases go in through the exec path, the image comes out as an OCI archive.
import { spawn } from "node:child_process";
import { createReadStream, createWriteStream, statSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { AgentSpec } from "../../contracts/agent.ts";
import { encodeSpec, frameDecoder, frameType, parseExit, ShortFrame, type ExitStatus } from "../../contracts/exec-wire.ts";
import type { GuestCall } from "../../contracts/fleet.ts";
import type { BuilderSize, ImageArtifact } from "../../contracts/image.ts";
import { AppError } from "../../lib/errors.ts";
import { baseNames } from "../build/base.ts";
import { BUILD_TIMESTAMP, buildFailure, parseStep } from "../build/buildah.ts";
import type { ContainerfileJob, ContainerfileRunner } from "../build/index.ts";
import { baseArchive, ensureBuilderImage, loadedKey } from "./builder-image.ts";

/** The builder's script (images/builder/build.sh, in the agentvm/builder base). */
const SCRIPT = "/usr/lib/agentvm/build/build.sh";
/** Where the script keeps builds' files inside the builder. */
const STATE = "/var/lib/agentvm-build";
/** Time for a short step of ours in the builder (a check, a base's load, a clean), ms. */
const stepMs = 10 * 60_000;
/** Time the exec server has to answer a call's head (an upload's whole body comes before it), ms. */
const answerMs = 10 * 60_000;

/** What a build needs of the gateway, injected by the composition (gateway/agents/builder-agent.ts, gateway/exec/guest.ts). */
export interface BuilderPorts {
  /** The tenant's builder agent running the builder image `digest` (made, or remade for another digest or size). */
  builderAgent(tenantId: string, digest: string, size: BuilderSize): Promise<AgentSpec>;
  /** One call to the agent's exec server, waking it and holding it awake while the answer streams; refusals thrown as the envelope's errors. */
  callGuest(agent: AgentSpec, call: GuestCall): Promise<Response>;
}

export interface VmBuilderOptions {
  ports: BuilderPorts;
  dataDir: string;
  cacheDir: string;
  size: BuilderSize;
  /** The longest a build's buildah may run in the builder, ms; past it the build fails (`build_failed`, timed out). */
  timeoutMs: number;
  /** Puts the builder's image into the shared store, where the host its agent lands on fetches it. */
  publish?(artifact: ImageArtifact): Promise<void>;
}

/** A builder of builds in microVMs: one runner per build, in the tenant's builder agent. */
export function createVmBuilder(opts: VmBuilderOptions): { runnerFor(tenantId: string, buildId: string): ContainerfileRunner } {
  return {
    runnerFor: (tenantId, buildId) => ({
      build: (job) => buildInVm(opts, tenantId, buildId, job),
    }),
  };
}

async function buildInVm(opts: VmBuilderOptions, tenantId: string, buildId: string, job: ContainerfileJob): Promise<string> {
  const { emit } = job;
  const signal = job.signal ? { signal: job.signal } : {};
  const image = await ensureBuilderImage({ dataDir: opts.dataDir, cacheDir: opts.cacheDir, onEvent: emit, ...signal });
  await opts.publish?.(image);
  const agent = await opts.ports.builderAgent(tenantId, image.digest, opts.size);
  emit({ type: "progress", phase: "build", text: `building in the tenant's builder ${agent.id} (a microVM of its own; the first call wakes it)` });
  const call = (argv: string[], timeoutMs: number, onLine?: (line: string) => void) =>
    execIn(opts.ports, agent, { argv: [SCRIPT, ...argv], timeoutMs, requestId: `req_${buildId}`, ...signal, ...(onLine ? { onLine } : {}) });

  for (const base of job.bases) {
    const key = loadedKey(base);
    if ((await call(["has-base", key], stepMs)).exit.exitCode === 0) continue;
    const archive = await baseArchive(base, opts.cacheDir, job.signal);
    emit({ type: "progress", phase: "base", text: `loading ${base.spec.repo}:${base.spec.tag} into the builder`, bytes: statSync(archive).size });
    const inVm = `${STATE}/in/${key}.tar`;
    await upload(
      opts.ports,
      agent,
      `/v1/files?path=${encodeURIComponent(inVm)}&mkdirs=1`,
      Readable.toWeb(createReadStream(archive)) as ReadableStream<Uint8Array>,
      buildId,
      job.signal,
    );
    const loaded = await call(["load-base", key, inVm, ...baseNames(base.spec)], stepMs);
    if (loaded.exit.exitCode !== 0) throw new AppError("internal", `loading ${base.name} into the builder failed:\n${loaded.tail.join("\n")}`);
  }

  const dir = `${STATE}/jobs/${buildId}`;
  try {
    const prepared = await call(["prepare", dir], stepMs);
    if (prepared.exit.exitCode !== 0) throw new AppError("internal", `the builder could not prepare the build:\n${prepared.tail.join("\n")}`);
    const tar = spawn("tar", ["-c", "-C", job.contextDir, "."], { stdio: ["ignore", "pipe", "ignore"] });
    const tarred = new Promise<number | null>((resolve) => tar.on("close", resolve));
    await upload(
      opts.ports,
      agent,
      `/v1/tar?path=${encodeURIComponent(`${dir}/context`)}`,
      Readable.toWeb(tar.stdout) as ReadableStream<Uint8Array>,
      buildId,
      job.signal,
    );
    if ((await tarred) !== 0) throw new AppError("internal", "tar of the build context failed");
    const built = await call(["build", dir, job.containerfile, String(BUILD_TIMESTAMP)], opts.timeoutMs, (line) => {
      const step = parseStep(line);
      emit(step ? { type: "step", ...step } : { type: "log", line });
    });
    if (built.exit.timedOut)
      throw new AppError(
        "build_failed",
        `the build ran past its limit of ${Math.round(opts.timeoutMs / 1000)} s and was stopped:\n${built.tail.slice(-10).join("\n")}`,
      );
    if (built.exit.exitCode !== 0) throw buildFailure(built.tail, "the builder VM");
    emit({ type: "progress", phase: "export", text: "reading the image out of the builder" });
    const out = join(job.work, "out.tar");
    const res = await opts.ports.callGuest(agent, {
      method: "GET",
      path: `/v1/files?path=${encodeURIComponent(`${dir}/out.tar`)}`,
      requestId: `req_${buildId}`,
      responseTimeoutMs: answerMs,
      idleTimeoutMs: answerMs,
      ...signal,
    });
    if (!res.body) throw new AppError("bad_gateway", "the builder answered no image");
    await pipeline(Readable.fromWeb(res.body as import("node:stream/web").ReadableStream<Uint8Array>), createWriteStream(out));
    return out;
  } finally {
    await call(["clean", dir], stepMs).catch(() => undefined);
  }
}

async function upload(
  ports: BuilderPorts,
  agent: AgentSpec,
  path: string,
  body: ReadableStream<Uint8Array>,
  buildId: string,
  signal?: AbortSignal,
): Promise<void> {
  const res = await ports.callGuest(agent, {
    method: "PUT",
    path,
    body,
    headers: { "content-type": "application/octet-stream" },
    requestId: `req_${buildId}`,
    responseTimeoutMs: answerMs,
    idleTimeoutMs: answerMs,
    ...(signal ? { signal } : {}),
  });
  await res.body?.cancel();
}

interface ExecResult {
  exit: ExitStatus;
  /** The last lines of its output (stdout and stderr as they came). */
  tail: string[];
}

/** Runs a command in the builder, its output line by line as it comes; answers how it ended and the last lines. */
async function execIn(
  ports: BuilderPorts,
  agent: AgentSpec,
  c: { argv: string[]; timeoutMs: number; requestId: string; signal?: AbortSignal; onLine?: (line: string) => void },
): Promise<ExecResult> {
  const res = await ports.callGuest(agent, {
    method: "POST",
    path: "/v1/exec",
    body: encodeSpec({ argv: c.argv, timeoutMs: c.timeoutMs, user: "root" }),
    headers: { "content-type": "application/octet-stream" },
    requestId: c.requestId,
    responseTimeoutMs: answerMs,
    idleTimeoutMs: c.timeoutMs + answerMs,
    ...(c.signal ? { signal: c.signal } : {}),
  });
  const tail: string[] = [];
  const partial = { [frameType.stdout]: "", [frameType.stderr]: "" } as Record<number, string>;
  const line = (text: string) => {
    tail.push(text);
    if (tail.length > 40) tail.shift();
    c.onLine?.(text);
  };
  const decoders = { [frameType.stdout]: new TextDecoder(), [frameType.stderr]: new TextDecoder() } as Record<number, TextDecoder>;
  const status = new ShortFrame();
  let exit: ExitStatus | undefined;
  let error: string | undefined;
  if (!res.body) throw new AppError("bad_gateway", "the builder's exec answered nothing");
  const reader = res.body.pipeThrough(frameDecoder()).getReader();
  for (;;) {
    const next = await reader.read();
    if (next.done) break;
    const frame = next.value;
    if (frame.type === frameType.stdout || frame.type === frameType.stderr) {
      const lines = (partial[frame.type] + decoders[frame.type]!.decode(frame.payload, { stream: true })).split(/\r?\n|\r/);
      partial[frame.type] = lines.pop() ?? "";
      for (const l of lines) line(l);
    } else if (frame.type === frameType.exit || frame.type === frameType.error) {
      const text = status.add(frame);
      if (text === undefined) continue;
      if (frame.type === frameType.error) error = text;
      else exit = parseExit(text);
    }
  }
  for (const rest of Object.values(partial)) if (rest) line(rest);
  if (!exit) throw new AppError("bad_gateway", `the builder's command ${c.argv[1]} ended without an exit status${error ? `: ${error}` : ""}`);
  if (error) line(error);
  return { exit, tail };
}
