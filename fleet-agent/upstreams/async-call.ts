// One attempt of an async upstream call, made by the host outside any VM connection: the queued request (its kept body, the secret headers added now) to the upstream, the whole answer gathered for its delivery.
import { randomBytes } from "node:crypto";
import { writeFile, rm, mkdir } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { join } from "node:path";
import type { Clock } from "../../lib/clock.ts";
import { AppError } from "../../lib/errors.ts";
import type { UpstreamConfig } from "../egress/config.ts";
import { requestUpstream, responseHopHeaders, upstreamUrl, type BodyKeeper, type DestinationCheck, type UpstreamDirectory } from "../egress/upstreams.ts";
import { usageReader } from "../egress/usage.ts";
import type { AsyncAnswer, AsyncCall } from "../operations/async-runner.ts";

export interface AsyncCallDeps {
  config: UpstreamConfig;
  directory: UpstreamDirectory;
  bodies: BodyKeeper;
  destination: DestinationCheck;
  /** Where an answer is written before it is kept. */
  spoolDir: string;
  clock: Clock;
}

/** Headers of the answer never kept: the hop's (egress/upstreams.ts), and a length the delivery sets itself. */
const notKept = (name: string) => responseHopHeaders.has(name) || name === "content-length";

/**
 * An answer is delivered whole (a webhook delivery's body): one larger than UPSTREAM_KEEP_BODY_BYTES fails the call
 * with `payload_too_large` rather than being cut. The upstream is looked up again at each attempt: a changed key
 * applies to calls still queued.
 */
export function createAsyncCall(deps: AsyncCallDeps): AsyncCall {
  return async (op, signal) => {
    const { config, clock } = deps;
    const upstream = await deps.directory.get(op.tenantId, op.upstream);
    if (!upstream) throw new AppError("upstream_not_found", `the tenant has no upstream named "${op.upstream}" any more`);
    const { target, port } = upstreamUrl(upstream.baseUrl, op.path);
    const dest = await deps.destination(target.hostname, port);
    if (!dest.ok) throw dest.error;
    const body = op.requestBody ? await deps.bodies.open(op.requestBody) : undefined;
    const sentAt = new Date(clock.now());
    const up = await new Promise<IncomingMessage>((resolve, reject) => {
      const out = requestUpstream({
        target,
        dest,
        method: op.method,
        rawHeaders: (op.requestHeaders ?? []).flat(),
        secrets: upstream.headers,
        bodyBytes: op.requestBytes,
        signal,
      });
      const headTimer = clock.setTimeout(
        () => out.destroy(new AppError("gateway_timeout", `upstream ${upstream.name} did not answer within ${config.timeoutMs} ms (UPSTREAM_TIMEOUT_MS)`)),
        config.timeoutMs,
      );
      out.once("response", (res) => {
        headTimer.cancel();
        resolve(res);
      });
      out.once("error", (err) => {
        headTimer.cancel();
        body?.destroy();
        reject(asCallError(err, upstream.name));
      });
      if (body) body.pipe(out);
      else out.end();
    });
    const firstByteAt = new Date(clock.now());
    const responseHeaders: [string, string][] = [];
    for (let i = 0; i < up.rawHeaders.length; i += 2)
      if (!notKept(up.rawHeaders[i]!.toLowerCase())) responseHeaders.push([up.rawHeaders[i]!.toLowerCase(), up.rawHeaders[i + 1]!]);
    const contentType = up.headers["content-type"];
    const usage = (up.headers["content-encoding"] ?? "identity") === "identity" ? usageReader(contentType) : undefined;
    const chunks: Buffer[] = [];
    let bytes = 0;
    await new Promise<void>((resolve, reject) => {
      up.on("data", (chunk: Buffer) => {
        bytes += chunk.length;
        if (bytes > config.keepBodyBytes) {
          up.destroy(
            new AppError(
              "payload_too_large",
              `upstream ${upstream.name}'s answer is over ${config.keepBodyBytes} bytes (UPSTREAM_KEEP_BODY_BYTES): an async answer is delivered whole`,
            ),
          );
          return;
        }
        usage?.push(chunk);
        chunks.push(chunk);
      });
      up.once("end", resolve);
      up.once("error", (err) => reject(asCallError(err, upstream.name)));
      up.once("aborted", () => reject(new AppError("bad_gateway", `upstream ${upstream.name} cut its answer`)));
    });
    const answer = Buffer.concat(chunks);
    const read = usage?.end() ?? {};
    return {
      status: up.statusCode ?? 502,
      headers: responseHeaders,
      body: new Uint8Array(answer.buffer, answer.byteOffset, answer.byteLength),
      responseBody: await keep(deps, answer),
      sentAt,
      firstByteAt,
      endedAt: new Date(clock.now()),
      model: read.model ?? null,
      inputTokens: read.inputTokens ?? null,
      outputTokens: read.outputTokens ?? null,
    } satisfies AsyncAnswer;
  };
}

/** The answer kept like a sync call's (so a plain call repeating the key is answered from it); null when it cannot be. */
async function keep(deps: AsyncCallDeps, body: Buffer): Promise<string | null> {
  await mkdir(deps.spoolDir, { recursive: true, mode: 0o700 });
  const file = join(deps.spoolDir, `async-${randomBytes(8).toString("hex")}`);
  try {
    await writeFile(file, body, { mode: 0o600 });
    return await deps.bodies.keep(file);
  } catch {
    return null;
  } finally {
    await rm(file, { force: true });
  }
}

function asCallError(err: unknown, name: string): AppError {
  if (err instanceof AppError) return err;
  if ((err as Error).name === "AbortError") return new AppError("gateway_timeout", "the call was stopped (its deadline, or the host stopping)");
  const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
  return new AppError("bad_gateway", `cannot reach upstream ${name}: ${code}`.slice(0, 300));
}
