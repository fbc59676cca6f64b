// The model and token usage of an OpenAI- or Anthropic-style completion, read from its response as it streams past: a JSON body or an SSE stream, parsed incrementally with bounded memory.
//
// What is read, from every JSON object the answer holds (the body, or each SSE event's `data:`), later values winning:
// - model: `model`, `message.model` (Anthropic's `message_start`), `response.model` (OpenAI's Responses API events);
// - usage: `usage`, `message.usage`, `response.usage`, with input = `prompt_tokens` (OpenAI chat) or `input_tokens`
//   (Anthropic, OpenAI Responses) and output = `completion_tokens` or `output_tokens`. OpenAI streams carry usage in
//   their final chunk (`stream_options.include_usage`); Anthropic's `message_start` has the input tokens and each
//   `message_delta` the output tokens so far.
// A JSON body over `maxJsonBytes`, or an SSE event over `maxEventBytes`, is skipped (its bytes still pass untouched).

export interface Usage {
  model?: string;
  inputTokens?: number;
  outputTokens?: number;
}

export interface UsageReader {
  /** Feeds the next bytes of the response body. */
  push(chunk: Buffer): void;
  /** The body ended: what it said. */
  end(): Usage;
}

export interface UsageLimits {
  /** A JSON body is parsed only up to this size. */
  maxJsonBytes: number;
  /** One SSE event (its data lines) is parsed only up to this size. */
  maxEventBytes: number;
}

export const defaultUsageLimits: UsageLimits = { maxJsonBytes: 4 * 1024 * 1024, maxEventBytes: 1024 * 1024 };

/** A reader for a response of this content type (undefined: neither JSON nor SSE, nothing to read). */
export function usageReader(contentType: string | undefined, limits: UsageLimits = defaultUsageLimits): UsageReader | undefined {
  const type = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  if (type === "text/event-stream") return sseUsage(limits.maxEventBytes);
  if (type === "application/json" || type.endsWith("+json")) return jsonUsage(limits.maxJsonBytes);
  return undefined;
}

/** Merges what one JSON value says into `into`. */
export function readUsageFrom(value: unknown, into: Usage): void {
  if (typeof value !== "object" || value === null) return;
  const o = value as Record<string, unknown>;
  for (const holder of [o, o.message, o.response]) {
    if (typeof holder !== "object" || holder === null) continue;
    const h = holder as Record<string, unknown>;
    if (typeof h.model === "string" && h.model) into.model = h.model.slice(0, 200);
    const u = h.usage;
    if (typeof u !== "object" || u === null) continue;
    const usage = u as Record<string, unknown>;
    const input = count(usage.prompt_tokens) ?? count(usage.input_tokens);
    const output = count(usage.completion_tokens) ?? count(usage.output_tokens);
    if (input !== undefined) into.inputTokens = input;
    if (output !== undefined) into.outputTokens = output;
  }
}

const count = (v: unknown) => (typeof v === "number" && Number.isSafeInteger(v) && v >= 0 && v <= 2 ** 31 - 1 ? v : undefined);

function jsonUsage(max: number): UsageReader {
  let parts: Buffer[] | undefined = [];
  let size = 0;
  return {
    push(chunk) {
      if (!parts) return;
      size += chunk.length;
      if (size > max)
        parts = undefined; // too large to parse: let it pass
      else parts.push(chunk);
    },
    end() {
      const usage: Usage = {};
      if (!parts) return usage;
      try {
        readUsageFrom(JSON.parse(Buffer.concat(parts).toString("utf8")), usage);
      } catch {
        /* not JSON after all */
      }
      parts = undefined;
      return usage;
    },
  };
}

/**
 * SSE (the WHATWG event stream format): lines end with LF, CR or CRLF; `data:` lines of one event are joined with LF;
 * an empty line dispatches it. Only the current line and the current event's data are held, each bounded.
 */
function sseUsage(maxEvent: number): UsageReader {
  const usage: Usage = {};
  let line: Buffer[] = [];
  let lineSize = 0;
  let lineTooLong = false;
  let data: string[] = [];
  let dataSize = 0;
  let eventTooLong = false;
  let lastWasCr = false;

  function dispatch(): void {
    if (!eventTooLong && data.length > 0) {
      const text = data.join("\n");
      if (text !== "[DONE]") {
        try {
          readUsageFrom(JSON.parse(text), usage);
        } catch {
          /* an event that is no JSON */
        }
      }
    }
    data = [];
    dataSize = 0;
    eventTooLong = false;
  }

  function endLine(): void {
    const text = lineTooLong ? undefined : Buffer.concat(line, lineSize).toString("utf8");
    line = [];
    lineSize = 0;
    if (lineTooLong) {
      lineTooLong = false;
      eventTooLong = true;
      return;
    }
    if (text === "") return dispatch();
    if (!text!.startsWith("data")) return; // event:, id:, retry:, comments
    const m = /^data:? ?(.*)$/s.exec(text!);
    if (!m) return;
    dataSize += m[1]!.length;
    if (dataSize > maxEvent) eventTooLong = true;
    else data.push(m[1]!);
  }

  return {
    push(chunk) {
      let start = 0;
      for (let i = 0; i < chunk.length; i++) {
        const b = chunk[i]!;
        if (b !== 0x0a && b !== 0x0d) continue;
        // CRLF is one line end: the LF right after a CR ends nothing.
        if (b === 0x0a && lastWasCr && i === start) {
          lastWasCr = false;
          start = i + 1;
          continue;
        }
        appendLine(chunk.subarray(start, i));
        endLine();
        lastWasCr = b === 0x0d;
        start = i + 1;
      }
      if (start < chunk.length) {
        lastWasCr = false;
        appendLine(chunk.subarray(start));
      }
    },
    end() {
      if (lineSize > 0) endLine();
      dispatch();
      return usage;
    },
  };

  function appendLine(part: Buffer): void {
    if (part.length === 0 || lineTooLong) return;
    lineSize += part.length;
    if (lineSize > maxEvent + 16) {
      lineTooLong = true;
      line = [];
      return;
    }
    line.push(Buffer.from(part)); // a copy: the chunk's memory is the stream's
  }
}
