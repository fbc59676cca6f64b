// The port image routes build through, and one build's record: its events (kept and followable), its outcome.
import { AppError } from "../lib/errors.ts";
import type { ImageArtifact } from "../contracts/image.ts";

/** What a build reports as it goes (images/build re-exports it as `BuildEvent`). */
export type ImageBuildEvent =
  | { type: "step"; step: number; total: number; text: string }
  | { type: "log"; line: string }
  | { type: "progress"; phase: "base" | "build" | "export" | "unpack" | "rootfs" | "store"; bytes?: number; text?: string };

export type BuildKind = "containerfile" | "archive";

export interface BuildUpload {
  tenantId: string;
  /** containerfile: the body is a tar of the build context; archive: an OCI archive or a `docker save` tarball. */
  kind: BuildKind;
  /** The Containerfile's path inside the context (default Containerfile, else Dockerfile). */
  file?: string;
  body: ReadableStream<Uint8Array>;
  /** Uploads past this many bytes fail with 413. */
  maxBytes: number;
}

export interface ImageBuilder {
  /** Starts a build of the upload; its progress and result are on the record (the build goes on if the caller leaves). */
  start(upload: BuildUpload): BuildRecord;
  get(buildId: string): BuildRecord | undefined;
  /** Removes an image's files from this machine, once no row names it and no agent runs it. */
  removeFiles(digest: string): Promise<void>;
}

export type BuildStatus = "running" | "succeeded" | "failed";

/** Events a record keeps for late followers; older ones are dropped (the full log is in the image's build.log). */
const KEPT_EVENTS = 10_000;

export class BuildRecord {
  readonly id: string;
  readonly tenantId: string;
  readonly kind: BuildKind;
  readonly startedAt: Date;
  finishedAt: Date | undefined;
  status: BuildStatus = "running";
  artifact: ImageArtifact | undefined;
  error: AppError | undefined;
  /** Settles with the build: resolves with the image, rejects with an AppError. */
  readonly done: Promise<ImageArtifact>;
  private readonly kept: ImageBuildEvent[] = [];
  private dropped = 0;
  private readonly listeners = new Set<(e: ImageBuildEvent | "end") => void>();
  private settle!: { resolve: (a: ImageArtifact) => void; reject: (e: AppError) => void };

  constructor(id: string, tenantId: string, kind: BuildKind, now: Date) {
    this.id = id;
    this.tenantId = tenantId;
    this.kind = kind;
    this.startedAt = now;
    this.done = new Promise((resolve, reject) => (this.settle = { resolve, reject }));
    this.done.catch(() => undefined); // a build nobody waits for must not be an unhandled rejection
  }

  emit(e: ImageBuildEvent): void {
    if (this.status !== "running") return;
    this.kept.push(e);
    if (this.kept.length > KEPT_EVENTS) {
      this.kept.shift();
      this.dropped++;
    }
    for (const l of this.listeners) l(e);
  }

  succeed(artifact: ImageArtifact, now: Date): void {
    if (this.status !== "running") return;
    this.status = "succeeded";
    this.artifact = artifact;
    this.finishedAt = now;
    this.end();
    this.settle.resolve(artifact);
  }

  fail(err: unknown, now: Date): void {
    if (this.status !== "running") return;
    this.status = "failed";
    this.error = err instanceof AppError ? err : new AppError("internal", "image build failed", { cause: err });
    this.finishedAt = now;
    this.end();
    this.settle.reject(this.error);
  }

  /** The events kept so far. */
  events(): ImageBuildEvent[] {
    return [...this.kept];
  }

  /** Every kept event, then (while running) each new one, until the build ends or `signal` aborts. */
  async *follow(signal?: AbortSignal): AsyncGenerator<ImageBuildEvent> {
    const queue: (ImageBuildEvent | "end")[] = [...this.kept];
    if (this.status !== "running") queue.push("end");
    let wake: (() => void) | undefined;
    const listener = (e: ImageBuildEvent | "end") => {
      queue.push(e);
      wake?.();
    };
    const onAbort = () => listener("end");
    if (this.status === "running") this.listeners.add(listener);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      for (;;) {
        while (queue.length > 0) {
          const e = queue.shift()!;
          if (e === "end") return;
          yield e;
        }
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    } finally {
      this.listeners.delete(listener);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /** The build as the API shows it. */
  view(): Record<string, unknown> {
    return {
      id: this.id,
      kind: this.kind,
      status: this.status,
      startedAt: this.startedAt.toISOString(),
      finishedAt: this.finishedAt?.toISOString() ?? null,
      digest: this.artifact?.digest ?? null,
      error: this.error ? { code: this.error.code, message: this.error.message } : null,
      droppedEvents: this.dropped,
    };
  }

  private end(): void {
    for (const l of this.listeners) l("end");
    this.listeners.clear();
  }
}

/** One event as a line of text: what the build log and the command line show. */
export function eventText(e: ImageBuildEvent): string {
  switch (e.type) {
    case "step":
      return `STEP ${e.step}/${e.total}: ${e.text}`;
    case "log":
      return e.line;
    case "progress":
      return `[${e.phase}]${e.text ? ` ${e.text}` : ""}${e.bytes !== undefined ? ` ${e.bytes} bytes` : ""}`;
  }
}
