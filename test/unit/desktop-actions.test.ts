// The desktop API's checks before anything reaches a VM: key names (gateway/desktop/keys.ts) and a batch against the display (checkActions).
import { describe, expect, it } from "vitest";
import { AppError } from "../../lib/errors.ts";
import { ActionsBody } from "../../gateway/desktop/api-schemas.ts";
import { parseKeys } from "../../gateway/desktop/keys.ts";
import { checkActions } from "../../gateway/desktop/routes.ts";

const screen = { width: 800, height: 600 };

function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).code).toBe("bad_request");
    return (err as AppError).message;
  }
  throw new Error("not refused");
}

describe("key combinations", () => {
  it("names keys as xdotool and the helper take them", () => {
    expect(parseKeys("ctrl+c")).toEqual({ keys: "ctrl+c" });
    expect(parseKeys("Control+Shift+T")).toEqual({ keys: "ctrl+shift+T" });
    expect(parseKeys("enter")).toEqual({ keys: "Return" });
    expect(parseKeys("esc")).toEqual({ keys: "Escape" });
    expect(parseKeys("alt+F4")).toEqual({ keys: "alt+F4" });
    expect(parseKeys("cmd+pgdn")).toEqual({ keys: "super+Page_Down" });
    expect(parseKeys("ctrl+-")).toEqual({ keys: "ctrl+minus" });
    expect(parseKeys("+")).toEqual({ keys: "plus" });
  });

  it("refuses an unknown name, naming it, and what is not a combination", () => {
    expect(parseKeys("ctrl+nosuchkey")).toEqual({ error: expect.stringContaining('unknown key "nosuchkey"') });
    expect(parseKeys("F25")).toEqual({ error: expect.stringContaining('"F25"') });
    expect(parseKeys("ctrl++")).toEqual({ error: expect.stringContaining("not a combination") });
    expect(parseKeys("é")).toEqual({ error: expect.stringContaining("unknown key") });
  });
});

describe("a batch against the display", () => {
  it("passes what is on the screen, keys renamed", () => {
    const out = checkActions(
      [
        { type: "click", x: 799, y: 599 },
        { type: "drag", startX: 0, startY: 0, x: 10, y: 10 },
        { type: "key", keys: "enter" },
        { type: "scroll", direction: "down" },
        { type: "wait", ms: 10_000 },
      ],
      screen,
    );
    expect(out[2]).toEqual({ type: "key", keys: "Return" });
    expect(out).toHaveLength(5);
  });

  it("refuses off-screen points, half a point, unknown keys and too long waits, naming the action", () => {
    expect(
      refusal(() =>
        checkActions(
          [
            { type: "move", x: 1, y: 1 },
            { type: "move", x: 800, y: 1 },
          ],
          screen,
        ),
      ),
    ).toBe("actions[1]: move at (800, 1) is off the 800x600 screen");
    expect(refusal(() => checkActions([{ type: "drag", startX: 0, startY: 600, x: 1, y: 1 }], screen))).toMatch(/^actions\[0\]: drag at \(0, 600\)/);
    expect(refusal(() => checkActions([{ type: "click", x: 5 }], screen))).toMatch(/needs both x and y/);
    expect(refusal(() => checkActions([{ type: "key", keys: "hyper+x" }], screen))).toMatch(/^actions\[0\]: keys: unknown key "hyper"/);
    const waits = Array.from({ length: 4 }, () => ({ type: "wait" as const, ms: 10_000 }));
    expect(refusal(() => checkActions(waits, screen))).toMatch(/^actions\[3\]: the batch's waits pass 30000 ms/);
  });

  it("the body's schema: at most 50 actions, known types, strict fields", () => {
    const move = { type: "move", x: 1, y: 1 };
    expect(ActionsBody.safeParse({ actions: Array.from({ length: 50 }, () => move) }).success).toBe(true);
    expect(ActionsBody.safeParse({ actions: Array.from({ length: 51 }, () => move) }).success).toBe(false);
    expect(ActionsBody.safeParse({ actions: [{ type: "teleport" }] }).success).toBe(false);
    expect(ActionsBody.safeParse({ actions: [{ ...move, z: 3 }] }).success).toBe(false);
    expect(ActionsBody.safeParse({ actions: [move], scale: 2 }).success).toBe(false);
    expect(ActionsBody.safeParse({ actions: [{ type: "type", text: "a\u0000b" }] }).success).toBe(false);
  });
});
