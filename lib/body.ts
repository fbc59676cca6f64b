// Reads a request body into memory without ever holding more than the limit: Content-Length first, then counted bytes.
import { AppError } from "./errors.ts";
import { concatBytes } from "./bytes.ts";

/**
 * The raw body bytes; throws `payload_too_large` (413) as soon as the declared or streamed size passes `maxBytes`
 * (the message names `what`: "body", "webhook body").
 */
export async function readBodyLimited(req: Request, maxBytes: number, what = "body"): Promise<Uint8Array> {
  const tooLarge = () => new AppError("payload_too_large", `${what} exceeds the ${maxBytes}-byte limit`);
  const declared = req.headers.get("content-length");
  if (declared !== null && /^\d+$/.test(declared.trim()) && Number(declared) > maxBytes) throw tooLarge();
  if (!req.body) return new Uint8Array(0);
  // A declared length is all the runtime hands over (its HTTP parser ends the body there): one read, the fastest.
  if (declared !== null && !req.headers.has("transfer-encoding")) {
    const bytes = new Uint8Array(await req.arrayBuffer().catch(cutOff));
    if (bytes.byteLength > maxBytes) throw tooLarge();
    return bytes;
  }

  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read().catch(cutOff);
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      // A sender that lies about (or omits) Content-Length is stopped here, before the rest is buffered.
      await reader.cancel().catch(() => {});
      throw tooLarge();
    }
    chunks.push(value);
  }
  if (chunks.length === 1 && chunks[0]) return chunks[0];
  return concatBytes(...chunks);
}

/** A body that stops before its end (the client went away, the connection broke) is the client's doing: a 400, logged as a rejection, not a 500 with a stack. */
function cutOff(err: unknown): never {
  if (err instanceof AppError) throw err;
  throw new AppError("bad_request", "the request body was cut off (the client went away?)", { cause: err });
}
