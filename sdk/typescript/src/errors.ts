// The one error the SDK throws: the API's error envelope (code, message, request id) or what kept the call from an answer.

/** A failed call: the envelope's `code` and `message` (`not_found`, `forbidden_path`, `pool_exhausted`…), its `requestId`, the HTTP `status` (0: no answer). */
export class AgentVMError extends Error {
  readonly code: string;
  readonly status: number;
  readonly requestId: string | undefined;
  readonly details: unknown;
  constructor(code: string, message: string, opts: { status?: number; requestId?: string; details?: unknown; cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "AgentVMError";
    this.code = code;
    this.status = opts.status ?? 0;
    this.requestId = opts.requestId;
    this.details = opts.details;
  }

  /** `AgentVMError not_found: agent agt_x not found (request req_y)`. */
  override toString(): string {
    return `${this.name} ${this.code}: ${this.message}${this.requestId ? ` (request ${this.requestId})` : ""}`;
  }

  /** The error of an answer's body: the envelope when it is one, else `http_<status>` with the body's start. */
  static fromBody(status: number, body: unknown): AgentVMError {
    const e = (body as { error?: { code?: unknown; message?: unknown; requestId?: unknown; details?: unknown } } | null)?.error;
    if (e && typeof e.code === "string" && typeof e.message === "string") {
      return new AgentVMError(e.code, e.message, {
        status,
        ...(typeof e.requestId === "string" ? { requestId: e.requestId } : {}),
        ...(e.details !== undefined ? { details: e.details } : {}),
      });
    }
    const text = typeof body === "string" ? body.trim() : body === undefined ? "" : JSON.stringify(body);
    return new AgentVMError(`http_${status}`, text.length > 300 ? `${text.slice(0, 300)}…` : text || "(empty body)", { status });
  }

  /** The error of a response that is not a success (its body read). */
  static async fromResponse(response: Response): Promise<AgentVMError> {
    const text = await response.text().catch(() => "");
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // not the envelope: the text says what happened
    }
    return AgentVMError.fromBody(response.status, body);
  }
}
