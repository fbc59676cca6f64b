// The egress proxy's upstream path: a VM's plain-HTTP call to `/u/<name>/<path>` becomes a call to its tenant's upstream
// `<name>` (over TLS for an https base URL) with the secret headers added, recorded as an operation, answered from the
// recorded outcome when the agent repeats an `Idempotency-Key`.
//
// One call, in order: the VM's owner (agent, tenant, run) and the upstream are looked up; the destination goes through
// policy.ts like any egress (EGRESS_ALLOW may open a private one); the request body is spooled to the host's disk while
// it is hashed (the hash must be known before the idempotency check, and nothing is held in memory); the operation row
// is inserted `in_flight` (the unique (agent, key) index is the arbiter across hosts); the body goes out; the answer
// streams back chunk by chunk (each through the exchange observer, so a dozing VM is resumed before its bytes), its
// usage read as it passes (usage.ts) and, up to UPSTREAM_KEEP_BODY_BYTES, kept; the row is finished with the outcome.
// A guest that goes away mid-answer does not stop the recording: the rest is read (while it is still worth keeping)
// so a retry after a restore or a crash is answered without calling the upstream again.
import { createHash, randomBytes, type Hash } from "node:crypto";
import { createReadStream, createWriteStream, type WriteStream } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import { request as httpRequest, type ClientRequest, type IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from "node:http";
import { request as httpsRequest } from "node:https";
import { isIP } from "node:net";
import { join } from "node:path";
import type { Readable } from "node:stream";
import type { Clock } from "../../lib/clock.ts";
import { AppError, errorStatus } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import type { Logger } from "../../lib/log.ts";
import { sendError } from "../../lib/node-respond.ts";
import { idempotencyKeyHeader, idempotencyKeyPattern, operationHeader, replayedHeader, upstreamHopHeaders, upstreamNamePattern } from "../../lib/upstreams.ts";
import type { UpstreamConfig } from "./config.ts";
import type { ExchangeObserver } from "./exchanges.ts";
import { usageReader, type Usage, type UsageReader } from "./usage.ts";

/** Whose VM it is: what the host knows of the agent running it now. */
export interface VmOwner {
  agentId: string;
  tenantId: string;
  runId: string | undefined;
}

/** A tenant's upstream with its secret headers opened. */
export interface OpenUpstream {
  id: string;
  name: string;
  baseUrl: string;
  headers: Record<string, string>;
}

/** The tenant's upstreams as the host reads them (fleet-agent/upstreams/directory.ts: Postgres, a short cache, unsealed). */
export interface UpstreamDirectory {
  get(tenantId: string, name: string): Promise<OpenUpstream | undefined>;
  /** The names of the tenant's live upstreams (what a booting VM's environment names). */
  names(tenantId: string): Promise<string[]>;
}

export type OperationState = "queued" | "in_flight" | "succeeded" | "failed";

/** An operation as the call inserts it (`in_flight`, mode sync). */
export interface NewOperation {
  id: string;
  tenantId: string;
  agentId: string;
  runId: string | undefined;
  hostId: string;
  upstream: string;
  method: string;
  path: string;
  requestHash: string;
  idempotencyKey: string | undefined;
  sentAt: Date;
  requestBytes: number;
}

/** What a replay needs of the first call with the same key. */
export interface RecordedOperation {
  id: string;
  requestHash: string;
  state: OperationState;
  status: number | null;
  responseHeaders: [string, string][] | null;
  responseBody: string | null;
}

export interface OperationOutcome {
  state: "succeeded" | "failed";
  status: number | null;
  error: { code: string; message: string } | null;
  firstByteAt: Date | null;
  endedAt: Date;
  responseBytes: number;
  responseHeaders: [string, string][] | null;
  requestBody: string | null;
  responseBody: string | null;
  usage: Usage;
}

/** The operation records (fleet-agent/upstreams/journal.ts: Postgres, the audit entry with the outcome). */
export interface OperationJournal {
  /**
   * Inserts the operation `in_flight`. With an idempotency key the agent's row of that key decides: none, the call is
   * this one's (`id` as given); one that failed with the same hash, it is taken over (its id, one more attempt);
   * anything else is answered as `existing`.
   */
  begin(op: NewOperation): Promise<{ claimed: true; id: string } | { claimed: false; existing: RecordedOperation }>;
  /** Ends it (and writes its audit entry). */
  finish(op: NewOperation, outcome: OperationOutcome): Promise<void>;
}

/** Kept bodies by content digest (fleet-agent/upstreams/bodies.ts: the shared artifact store, or the host's data directory). */
export interface BodyKeeper {
  /** Keeps the file's bytes; answers their digest (`sha256:<hex>`). The file stays the caller's. */
  keep(file: string): Promise<string>;
  /** A kept body as a stream. */
  open(digest: string): Promise<Readable>;
}

/** A call the host is to make later (`Prefer: respond-async`), as queued. */
export interface QueuedCall {
  tenantId: string;
  agentId: string;
  runId: string | null;
  hostId: string;
  upstream: string;
  method: string;
  path: string;
  requestHash: string;
  idempotencyKey: string | null;
  /** The agent's headers, hop-by-hop, `Prefer` and the secret headers' names removed (the secrets are added when the call is made). */
  requestHeaders: [string, string][];
  requestBody: string | null;
  requestBytes: number;
  deadlineAt: Date;
  createdAt: Date;
}

/** An async call as the agent may read it: its state and, once settled, the outcome as delivered. */
export interface QueuedOperation {
  id: string;
  state: OperationState;
  requestHash: string;
  status: number | null;
  error: { code: string; message: string } | null;
  outcome?: { headers: [string, string][]; body: Uint8Array };
}

/** Async calls (fleet-agent/operations/: the queue in Postgres, the runner that makes them, delivery through the webhook worker). */
export interface AsyncCalls {
  /** Queues the call; with an idempotency key the agent used before, the earlier operation instead (`queued: false`). */
  enqueue(call: QueuedCall): Promise<{ queued: boolean; operation: QueuedOperation }>;
  /** The agent's operation (any mode), with its outcome once there is one. */
  read(agentId: string, id: string): Promise<QueuedOperation | undefined>;
}

export interface UpstreamCallsDeps {
  config: UpstreamConfig;
  /** Where `Prefer: respond-async` calls go; none: such calls are made as plain ones (the preference is optional, RFC 7240). */
  async?: AsyncCalls;
  /** The VM's agent, tenant and run (the host's VM table); undefined when the host does not run it. */
  owner(vmId: string): VmOwner | undefined;
  directory: UpstreamDirectory;
  journal: OperationJournal;
  bodies: BodyKeeper;
  /** Where request bodies are spooled and response bodies gathered for keeping (host-local). */
  spoolDir: string;
  hostId: string;
  clock: Clock;
  log: Logger;
}

/** Where an upstream's address may be reached (the proxy's `destination`: policy.ts over every resolved address). */
export type DestinationCheck = (
  host: string,
  port: number,
) => Promise<{ ok: true; address: string; port: number; host: string } | { ok: false; error: AppError }>;

/** One call as the proxy hands it over. */
export interface UpstreamCall {
  vmId: string;
  requestId: string;
  req: IncomingMessage;
  res: ServerResponse;
  /** The upstream's name and the path (with query) below it, as the guest sent them. */
  name: string;
  rest: string;
  destination: DestinationCheck;
  exchanges: ExchangeObserver;
  /** The proxy's idle bound on a connection, ms (applies to the upstream's answer once it started). */
  idleTimeoutMs: number;
}

/** A read of `/operations/<id>` as the proxy hands it over. */
export interface OperationRead {
  vmId: string;
  requestId: string;
  res: ServerResponse;
  id: string;
}

/** What the proxy asks of the upstream path. */
export interface UpstreamPath {
  handle(call: UpstreamCall): Promise<void>;
  /** `GET /operations/<id>`: an async call's state, or its outcome as the agent's callback gets it. */
  operation(read: OperationRead): Promise<void>;
  /** The names a VM booting now should find in its environment (`AGENTVM_UPSTREAM_<NAME>_URL`); [] when unknown. */
  names(vmId: string): Promise<string[]>;
}

/** `/u/<name>/<rest>` (or `/u/<name>`) → its parts; undefined for any other path. */
export function upstreamTarget(path: string): { name: string; rest: string } | undefined {
  if (!path.startsWith("/u/")) return undefined;
  const after = path.slice(3);
  const cut = after.search(/[/?]/);
  const name = cut < 0 ? after : after.slice(0, cut);
  let rest = cut < 0 ? "/" : after.slice(cut);
  if (rest.startsWith("?")) rest = `/${rest}`;
  return { name, rest };
}

/** sha256 (hex) of what decides an answer: method, path and query, content-type, accept, then the body (fed to the hash). */
export function requestHasher(method: string, path: string, contentType: string | undefined, accept: string | undefined): Hash {
  return createHash("sha256").update(`${method.toUpperCase()}\n${path}\n${contentType ?? ""}\n${accept ?? ""}\n`);
}

/** Headers of the answer never passed on (they belong to the hop). */
export const responseHopHeaders: ReadonlySet<string> = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

export class UpstreamCalls implements UpstreamPath {
  private readonly deps: UpstreamCallsDeps;
  private spoolReady: Promise<unknown> | undefined;

  constructor(deps: UpstreamCallsDeps) {
    this.deps = deps;
  }

  async names(vmId: string): Promise<string[]> {
    const owner = this.deps.owner(vmId);
    return owner ? this.deps.directory.names(owner.tenantId) : [];
  }

  async handle(call: UpstreamCall): Promise<void> {
    const { req, res, requestId, vmId } = call;
    const started = this.deps.clock.monotonic();
    let spool: Spooled | undefined;
    try {
      const owner = this.deps.owner(vmId);
      if (!owner) throw new AppError("forbidden", "this VM is not one its host runs now");
      if (!upstreamNamePattern.test(call.name)) throw new AppError("upstream_not_found", `no upstream named "${call.name.slice(0, 64)}"`);
      const key = idempotencyKeyOf(req);
      const declared = Number(req.headers["content-length"] ?? 0);
      if (declared > this.deps.config.maxBodyBytes)
        throw new AppError("payload_too_large", `a body through an upstream is at most ${this.deps.config.maxBodyBytes} bytes (UPSTREAM_MAX_BODY_BYTES)`);
      if (/(^|\/)(\.|%2e){2}(\/|$|\?)/i.test(call.rest.split("?")[0]!))
        throw new AppError("bad_request", "the path below an upstream must not climb out of it (..)");
      const upstream = await this.deps.directory.get(owner.tenantId, call.name);
      if (!upstream) throw new AppError("upstream_not_found", `this agent's tenant has no upstream named "${call.name}"`);
      const { target, port } = upstreamUrl(upstream.baseUrl, call.rest);
      const dest = await call.destination(target.hostname, port);
      if (!dest.ok) throw dest.error;
      const method = (req.method ?? "GET").toUpperCase();
      spool = await this.spoolRequest(req, requestHasher(method, call.rest, header(req, "content-type"), header(req, "accept")));
      const op: NewOperation = {
        id: newId("operation"),
        tenantId: owner.tenantId,
        agentId: owner.agentId,
        runId: owner.runId,
        hostId: this.deps.hostId,
        upstream: upstream.name,
        method,
        path: call.rest,
        requestHash: spool.hash,
        idempotencyKey: key,
        sentAt: new Date(this.deps.clock.now()),
        requestBytes: spool.bytes,
      };
      if (this.deps.async && prefersAsync(req)) return await this.queue(call, op, upstream, spool, this.deps.async);
      const claim = await this.deps.journal.begin(op);
      if (!claim.claimed) return await this.replay(call, op, claim.existing);
      op.id = claim.id;
      await this.send(call, op, upstream, dest, target, spool);
      this.deps.log.debug("upstream call", { requestId, vmId, upstream: upstream.name, opId: op.id, ms: Math.round(this.deps.clock.monotonic() - started) });
    } catch (err) {
      const e = err instanceof AppError ? err : new AppError("internal", "internal error", { cause: err });
      this.deps.log.info("upstream call refused", { requestId, vmId, upstream: call.name, status: e.status, code: e.code, why: e.message });
      sendError(res, e, requestId, { closeConnection: true });
    } finally {
      if (spool) await rm(spool.file, { force: true });
    }
  }

  /**
   * `Prefer: respond-async`: the call is queued in Postgres (its body kept: the host that makes it may be another) and
   * answered `202 {operationId}` at once; the agent need not stay awake for it. The outcome comes to the agent's
   * callback path, or is read at `/operations/<id>`.
   */
  private async queue(call: UpstreamCall, op: NewOperation, upstream: OpenUpstream, spool: Spooled, async: AsyncCalls): Promise<void> {
    const { config, clock } = this.deps;
    if (spool.bytes > config.keepBodyBytes)
      throw new AppError(
        "payload_too_large",
        `an async call's body is kept until the call is made: at most ${config.keepBodyBytes} bytes (UPSTREAM_KEEP_BODY_BYTES)`,
      );
    const requestBody = spool.bytes > 0 ? await this.deps.bodies.keep(spool.file) : null;
    const now = clock.now();
    const { queued, operation } = await async.enqueue({
      tenantId: op.tenantId,
      agentId: op.agentId,
      runId: op.runId ?? null,
      hostId: op.hostId,
      upstream: upstream.name,
      method: op.method,
      path: op.path,
      requestHash: op.requestHash,
      idempotencyKey: op.idempotencyKey ?? null,
      requestHeaders: queuedHeaders(call.req.rawHeaders, upstream.headers),
      requestBody,
      requestBytes: spool.bytes,
      deadlineAt: new Date(now + config.async.deadlineMs),
      createdAt: new Date(now),
    });
    if (!queued && operation.requestHash !== op.requestHash)
      throw new AppError("idempotency_conflict", `Idempotency-Key "${op.idempotencyKey}" was used by operation ${operation.id} for another request`, {
        details: { operationId: operation.id },
      });
    const body = JSON.stringify({ operationId: operation.id, state: operation.state, location: `/operations/${operation.id}` });
    call.res.writeHead(202, {
      "content-type": "application/json",
      "preference-applied": "respond-async",
      location: `/operations/${operation.id}`,
      [operationHeader]: operation.id,
      "content-length": Buffer.byteLength(body),
    });
    call.res.end(body);
    this.deps.log.info(queued ? "upstream call queued" : "upstream call already queued", {
      requestId: call.requestId,
      vmId: call.vmId,
      opId: operation.id,
      upstream: upstream.name,
    });
  }

  async operation(read: OperationRead): Promise<void> {
    const { res, requestId, vmId } = read;
    try {
      const owner = this.deps.owner(vmId);
      if (!owner) throw new AppError("forbidden", "this VM is not one its host runs now");
      const op = this.deps.async ? await this.deps.async.read(owner.agentId, read.id) : undefined;
      if (!op) throw new AppError("not_found", `this agent has no operation ${read.id.slice(0, 64)}`);
      if (!op.outcome) {
        const body = JSON.stringify({ operationId: op.id, state: op.state });
        res.writeHead(202, { "content-type": "application/json", "retry-after": "1", [operationHeader]: op.id, "content-length": Buffer.byteLength(body) });
        res.end(body);
        return;
      }
      const status = op.status ?? (op.error ? statusOf(op.error.code) : 502);
      const head: string[] = [];
      for (const [k, v] of op.outcome.headers) head.push(k, v);
      head.push(operationHeader, op.id, "content-length", String(op.outcome.body.byteLength));
      res.writeHead(status, head);
      res.end(op.outcome.body);
    } catch (err) {
      const e = err instanceof AppError ? err : new AppError("internal", "internal error", { cause: err });
      this.deps.log.info("operation read refused", { requestId, vmId, status: e.status, why: e.message });
      sendError(res, e, requestId, { closeConnection: true });
    }
  }

  /** The request body on the host's disk, hashed and counted as it arrives; 413 past the limit. */
  private async spoolRequest(req: IncomingMessage, hash: Hash): Promise<Spooled> {
    this.spoolReady ??= mkdir(this.deps.spoolDir, { recursive: true, mode: 0o700 });
    await this.spoolReady;
    const file = join(this.deps.spoolDir, `req-${randomBytes(8).toString("hex")}`);
    const out = createWriteStream(file, { mode: 0o600 });
    let bytes = 0;
    const max = this.deps.config.maxBodyBytes;
    try {
      await new Promise<void>((resolve, reject) => {
        req.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
          if (bytes > max) {
            req.pause();
            reject(new AppError("payload_too_large", `a body through an upstream is at most ${max} bytes (UPSTREAM_MAX_BODY_BYTES)`));
            return;
          }
          hash.update(chunk);
          if (!out.write(chunk)) {
            req.pause();
            out.once("drain", () => req.resume());
          }
        });
        req.once("end", resolve);
        req.once("error", reject);
        req.once("aborted", () => reject(new AppError("bad_request", "the agent's request body was cut")));
        out.once("error", reject);
      });
      await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
    } catch (err) {
      out.destroy();
      await rm(file, { force: true });
      throw err;
    }
    return { file, bytes, hash: hash.digest("hex") };
  }

  /** The first call's recorded outcome, or why it cannot be given. */
  private async replay(call: UpstreamCall, op: NewOperation, first: RecordedOperation): Promise<void> {
    if (first.requestHash !== op.requestHash)
      throw new AppError("idempotency_conflict", `Idempotency-Key "${op.idempotencyKey}" was used by operation ${first.id} for another request`, {
        details: { operationId: first.id },
      });
    if (first.state !== "succeeded")
      throw new AppError("idempotency_in_flight", `operation ${first.id} with this Idempotency-Key is still in flight: retry after it ends`, {
        retryAfterS: 1,
        details: { operationId: first.id },
      });
    if (first.responseBody === null || first.status === null)
      throw new AppError(
        "conflict",
        `operation ${first.id} with this Idempotency-Key succeeded but its response body was not kept (over UPSTREAM_KEEP_BODY_BYTES): it cannot be replayed`,
        {
          details: { operationId: first.id },
        },
      );
    const body = await this.deps.bodies.open(first.responseBody);
    const head: string[] = [];
    for (const [k, v] of first.responseHeaders ?? []) head.push(k, v);
    head.push(replayedHeader, first.id, operationHeader, first.id);
    call.res.writeHead(first.status, head);
    await new Promise<void>((resolve) => {
      body.once("error", () => {
        call.res.destroy();
        resolve();
      });
      call.res.once("close", resolve);
      body.pipe(call.res);
    });
    this.deps.log.info("upstream call replayed", { requestId: call.requestId, vmId: call.vmId, opId: first.id, upstream: op.upstream });
  }

  /** Sends the spooled request to the checked address and streams the answer back; finishes the operation either way. */
  private async send(
    call: UpstreamCall,
    op: NewOperation,
    upstream: OpenUpstream,
    dest: { address: string; port: number; host: string },
    target: URL,
    spool: Spooled,
  ): Promise<void> {
    const { req, res, vmId, exchanges } = call;
    const { clock, config } = this.deps;
    const exchangeId = op.id;
    const keptRequest = spool.bytes <= config.keepBodyBytes ? this.deps.bodies.keep(spool.file).catch(() => null) : Promise.resolve(null);
    const keeper = new BodyGatherer(join(this.deps.spoolDir, `res-${randomBytes(8).toString("hex")}`), config.keepBodyBytes);
    const out = requestUpstream({ target, dest, method: op.method, rawHeaders: req.rawHeaders, secrets: upstream.headers, bodyBytes: spool.bytes });

    let status: number | null = null;
    let firstByteAt: Date | null = null;
    let responseHeaders: [string, string][] | null = null;
    let responseBytes = 0;
    let guestGone = false;
    let settled = false;
    const read: { usage: UsageReader | undefined } = { usage: undefined };
    let done!: (outcome: { ok: true } | { ok: false; error: AppError }) => void;
    const finished = new Promise<{ ok: true } | { ok: false; error: AppError }>((resolve) => (done = resolve));
    const settle = (o: { ok: true } | { ok: false; error: AppError }) => {
      if (settled) return;
      settled = true;
      headTimer.cancel();
      done(o);
    };

    const headTimer = clock.setTimeout(
      () => out.destroy(new AppError("gateway_timeout", `upstream ${upstream.name} did not answer within ${config.timeoutMs} ms (UPSTREAM_TIMEOUT_MS)`)),
      config.timeoutMs,
    );
    res.once("close", () => {
      if (settled) return;
      guestGone = true;
      exchanges.ended(vmId, exchangeId);
      // The upstream may already be acting on the call: its answer is still awaited and recorded, so a retry after a
      // restore or a crash replays it. Once the answer is not worth keeping, the upstream is let go.
      if (!keeper.keeping) out.destroy(new AppError("bad_request", "the agent went away before the answer ended"));
    });
    out.once("error", (err) => settle({ ok: false, error: asUpstreamError(err, upstream.name) }));
    out.once("finish", () => exchanges.waiting(vmId, exchangeId));
    out.once("response", (up: IncomingMessage) => {
      headTimer.cancel();
      status = up.statusCode ?? 502;
      firstByteAt = new Date(clock.now());
      out.setTimeout(call.idleTimeoutMs, () =>
        out.destroy(new AppError("gateway_timeout", `upstream ${upstream.name} sent nothing for ${call.idleTimeoutMs} ms`)),
      );
      responseHeaders = [];
      for (let i = 0; i < up.rawHeaders.length; i += 2)
        if (!responseHopHeaders.has(up.rawHeaders[i]!.toLowerCase())) responseHeaders.push([up.rawHeaders[i]!, up.rawHeaders[i + 1]!]);
      const encoding = (header(up, "content-encoding") ?? "identity").toLowerCase();
      read.usage = encoding === "identity" ? usageReader(header(up, "content-type")) : undefined;
      const head: string[] = [];
      for (const [k, v] of responseHeaders) head.push(k, v);
      head.push(operationHeader, op.id);
      const resume = () => up.resume();
      const write = (chunk: Buffer | undefined) => {
        if (guestGone) return resume();
        if (chunk === undefined) res.writeHead(status!, head);
        else if (!res.write(chunk)) return void res.once("drain", resume);
        resume();
      };
      // The head and every chunk go through the exchange observer: a dozing VM runs again before its bytes arrive.
      const deliver = (chunk: Buffer | undefined) => {
        if (guestGone) return;
        const wait = exchanges.answer(vmId, exchangeId);
        up.pause();
        if (wait) void wait.then(() => write(chunk));
        else write(chunk);
      };
      res.once("close", resume); // a guest gone mid-drain: the answer is still read for the record
      up.on("data", (chunk: Buffer) => {
        responseBytes += chunk.length;
        read.usage?.push(chunk);
        keeper.write(chunk);
        if (guestGone && !keeper.keeping) return void out.destroy(new AppError("bad_request", "the agent went away before the answer ended"));
        deliver(chunk);
      });
      up.once("end", () => settle({ ok: true }));
      up.once("aborted", () => settle({ ok: false, error: new AppError("bad_gateway", `upstream ${upstream.name} cut its answer`) }));
      up.once("error", (err) => settle({ ok: false, error: asUpstreamError(err, upstream.name) }));
      deliver(undefined);
    });

    const body = createReadStream(spool.file);
    body.once("error", (err) => out.destroy(err));
    body.pipe(out);

    const result = await finished;
    if (result.ok) {
      if (!guestGone) res.end();
    } else if (!guestGone) sendError(res, result.error, call.requestId, { closeConnection: true });
    if (!guestGone) exchanges.ended(vmId, exchangeId);
    if (!result.ok)
      this.deps.log.info("upstream call failed", { requestId: call.requestId, vmId, opId: op.id, upstream: upstream.name, why: result.error.message });
    const [requestBody, responseBody] = await Promise.all([keptRequest, result.ok ? keeper.keep(this.deps.bodies) : keeper.drop().then(() => null)]);
    await this.deps.journal.finish(op, {
      state: result.ok ? "succeeded" : "failed",
      status: result.ok ? status : null,
      error: result.ok ? null : { code: result.error.code, message: result.error.message },
      firstByteAt,
      endedAt: new Date(clock.now()),
      responseBytes,
      responseHeaders,
      requestBody,
      responseBody,
      usage: read.usage?.end() ?? {},
    });
  }
}

interface Spooled {
  file: string;
  bytes: number;
  hash: string;
}

/** A response body gathered on disk while it is no larger than the limit; dropped as soon as it is. */
class BodyGatherer {
  private out: WriteStream | undefined;
  private bytes = 0;
  private readonly file: string;
  private readonly limit: number;
  keeping: boolean;

  constructor(file: string, limit: number) {
    this.file = file;
    this.limit = limit;
    this.keeping = limit > 0;
  }

  write(chunk: Buffer): void {
    if (!this.keeping) return;
    this.bytes += chunk.length;
    if (this.bytes > this.limit) {
      void this.drop();
      return;
    }
    this.out ??= createWriteStream(this.file, { mode: 0o600 });
    this.out.write(chunk);
  }

  /** The gathered body kept (its digest), or null when it was not kept; the file is removed either way. */
  async keep(bodies: BodyKeeper): Promise<string | null> {
    if (!this.keeping) return null;
    try {
      this.out ??= createWriteStream(this.file, { mode: 0o600 });
      const out = this.out;
      await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
      return await bodies.keep(this.file);
    } catch {
      return null;
    } finally {
      await rm(this.file, { force: true });
    }
  }

  async drop(): Promise<void> {
    this.keeping = false;
    this.out?.destroy();
    this.out = undefined;
    await rm(this.file, { force: true });
  }
}

function header(m: IncomingMessage, name: string): string | undefined {
  const v = m.headers[name];
  return Array.isArray(v) ? v.join(", ") : v;
}

/** The agent's `Idempotency-Key` (1–255 printable ASCII), undefined when it sent none; 400 for a malformed one. */
function idempotencyKeyOf(req: IncomingMessage): string | undefined {
  const raw = req.headers[idempotencyKeyHeader];
  if (raw === undefined) return undefined;
  if (Array.isArray(raw) || !idempotencyKeyPattern.test(raw))
    throw new AppError("bad_request", "Idempotency-Key must be one header of 1–255 printable ASCII characters");
  return raw;
}

/** `baseUrl` with the path below it, and the port that names (the scheme's default where none is given). */
export function upstreamUrl(baseUrl: string, rest: string): { target: URL; port: number } {
  const target = new URL(`${baseUrl.replace(/\/+$/, "")}${rest}`);
  return { target, port: target.port ? Number(target.port) : target.protocol === "https:" ? 443 : 80 };
}

/**
 * The request to an upstream at its checked address (TLS for https, the certificate checked against the URL's host):
 * the agent's headers as `outgoingHeaders` makes them, `Host`, and the body's length (none for a bodiless GET-like call).
 */
export function requestUpstream(o: {
  target: URL;
  dest: { address: string; port: number; host: string };
  method: string;
  rawHeaders: readonly string[];
  secrets: Record<string, string>;
  bodyBytes: number;
  signal?: AbortSignal;
}): ClientRequest {
  const headers = outgoingHeaders(o.rawHeaders, o.secrets);
  headers.host = o.target.host;
  if (o.bodyBytes > 0 || !["GET", "HEAD", "DELETE", "OPTIONS"].includes(o.method)) headers["content-length"] = String(o.bodyBytes);
  const send = o.target.protocol === "https:" ? httpsRequest : httpRequest;
  return send({
    host: o.dest.address,
    port: o.dest.port,
    method: o.method,
    path: `${o.target.pathname}${o.target.search}`,
    headers,
    setHost: false,
    agent: false,
    ...(o.signal ? { signal: o.signal } : {}),
    ...(o.target.protocol === "https:" && !isIP(o.dest.host) ? { servername: o.dest.host } : {}),
  });
}

/**
 * The agent's headers minus hop-by-hop ones, `Host`, `Content-Length` (set from the spooled body) and any named like a
 * secret header (the secret wins), then the secret headers. `Accept-Encoding: identity`: the answer's usage is read as
 * it passes (the guest's link to the proxy gains nothing from compression).
 */
export function outgoingHeaders(rawHeaders: readonly string[], secrets: Record<string, string>): OutgoingHttpHeaders {
  const secretNames = new Set(Object.keys(secrets).map((n) => n.toLowerCase()));
  const out: OutgoingHttpHeaders = {};
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (upstreamHopHeaders.has(name) || name === "content-length" || name === "accept-encoding" || secretNames.has(name)) continue;
    const value = rawHeaders[i + 1]!;
    const prev = out[name];
    out[name] = prev === undefined ? value : Array.isArray(prev) ? [...prev, value] : [String(prev), value];
  }
  for (const [name, value] of Object.entries(secrets)) out[name.toLowerCase()] = value;
  out["accept-encoding"] = "identity";
  return out;
}

/** `Prefer: respond-async` (RFC 7240), among other preferences or alone. */
function prefersAsync(req: IncomingMessage): boolean {
  const v = req.headers.prefer;
  return v !== undefined && /(^|[,\s])respond-async(\s*(;|,|$))/i.test(Array.isArray(v) ? v.join(",") : v);
}

/** What an async call keeps of the agent's headers: as `outgoingHeaders` sends them, less the secrets (added when made) and `Prefer`. */
export function queuedHeaders(rawHeaders: readonly string[], secrets: Record<string, string>): [string, string][] {
  const secretNames = new Set(Object.keys(secrets).map((n) => n.toLowerCase()));
  const out: [string, string][] = [];
  for (const [name, value] of Object.entries(outgoingHeaders(rawHeaders, {}))) {
    if (secretNames.has(name) || name === "prefer" || value === undefined) continue;
    for (const v of Array.isArray(value) ? value : [String(value)]) out.push([name, v]);
  }
  return out;
}

/** The status an error code answers with (lib/errors.ts), for an outcome that is an error. */
function statusOf(code: string): number {
  return (errorStatus as Record<string, number>)[code] ?? 502;
}

function asUpstreamError(err: unknown, name: string): AppError {
  if (err instanceof AppError) return err;
  const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
  return new AppError("bad_gateway", `cannot reach upstream ${name}: ${code}`.slice(0, 300));
}

/**
 * The upstream path before the host that serves it is built (the driver and its proxy come first, the database and
 * the host after): calls answer 503 until `bind`.
 */
export class UpstreamSlot implements UpstreamPath {
  private bound: UpstreamPath | undefined;

  bind(path: UpstreamPath): void {
    this.bound = path;
  }

  handle(call: UpstreamCall): Promise<void> {
    if (this.bound) return this.bound.handle(call);
    sendError(call.res, new AppError("host_unavailable", "this host serves no upstreams yet", { retryAfterS: 1 }), call.requestId, { closeConnection: true });
    return Promise.resolve();
  }

  operation(read: OperationRead): Promise<void> {
    if (this.bound) return this.bound.operation(read);
    sendError(read.res, new AppError("host_unavailable", "this host serves no upstreams yet", { retryAfterS: 1 }), read.requestId, { closeConnection: true });
    return Promise.resolve();
  }

  names(vmId: string): Promise<string[]> {
    return this.bound ? this.bound.names(vmId) : Promise.resolve([]);
  }
}
