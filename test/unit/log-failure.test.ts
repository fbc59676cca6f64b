// How a failed call is logged (lib/errors.ts logFailure): a bug or an outage as an error, a refusal — 4xx, or a 501
// for a capability the deployment lacks — as an info line without a stack.
import { describe, expect, it } from "vitest";
import { AppError, logFailure } from "../../lib/errors.ts";
import { createLogger } from "../../lib/log.ts";

function logged(err: unknown): { level: string; msg: string; stack?: string } {
  const lines: string[] = [];
  logFailure(createLogger({ level: "debug", write: (l) => lines.push(l) }), err, { requestId: "req_x", method: "POST", path: "/v1/x" });
  expect(lines).toHaveLength(1);
  return JSON.parse(lines[0]!) as { level: string; msg: string; stack?: string };
}

describe("logFailure", () => {
  it("logs a bug as an error with its stack, a 4xx and a 501 as rejections", () => {
    expect(logged(new Error("boom"))).toMatchObject({ level: "error", msg: "request failed", stack: expect.stringContaining("boom") });
    expect(logged(new AppError("bad_request", "no"))).toMatchObject({ level: "info", msg: "request rejected" });
    const unsupported = logged(new AppError("checkpoints_unsupported", "the process driver keeps no checkpoints"));
    expect(unsupported).toMatchObject({ level: "info", msg: "request rejected" });
    expect(unsupported.stack).toBeUndefined();
  });
});
