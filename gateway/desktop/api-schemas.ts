// The desktop API's schemas: a screenshot's query, an action batch's body (each action a strict object by `type`) and its answer.
import { z } from "../../lib/api.ts";
import { AgentParams } from "../agents/api-schemas.ts";

export { AgentParams };

/** The most actions one batch takes. */
export const maxActions = 50;
/** The longest `wait` one action may hold, and all of a batch's waits together, ms. */
export const maxWaitMs = 10_000;
export const maxBatchWaitMs = 30_000;
/** The most characters one `type` action types. */
export const maxTypeChars = 4096;

const message = (min: number, max: number) => `must be an integer from ${min} to ${max}`;
const intIn = (min: number, max: number) =>
  z
    .number({ error: message(min, max) })
    .int({ error: message(min, max) })
    .min(min, { error: message(min, max) })
    .max(max, { error: message(min, max) });
/** A coordinate; whether it is on the agent's screen is checked against its size after parsing. */
const coord = () => intIn(0, 100_000);
const Button = z.enum(["left", "middle", "right"], { error: "must be left, middle or right" });

const Scale = z
  .string({ error: "must be a number from 0.1 to 1" })
  .regex(/^(0(\.\d{1,3})?|1(\.0{1,3})?)$/, { error: "must be a number from 0.1 to 1" })
  .transform(Number)
  .refine((n) => n >= 0.1 && n <= 1, { error: "must be a number from 0.1 to 1" });

export const ScreenshotQuery = z.object({
  scale: Scale.optional().openapi({ description: "Scale the picture by this factor, 0.1 to 1 (default 1: the display's own size)", example: "0.5" }),
});

const Move = z.strictObject({ type: z.literal("move"), x: coord(), y: coord() });
const Click = z.strictObject({
  type: z.enum(["click", "double_click"]),
  x: coord().optional(),
  y: coord().optional(),
  button: Button.optional(),
});
const Drag = z.strictObject({ type: z.literal("drag"), startX: coord(), startY: coord(), x: coord(), y: coord(), button: Button.optional() });
const Scroll = z.strictObject({
  type: z.literal("scroll"),
  x: coord().optional(),
  y: coord().optional(),
  direction: z.enum(["up", "down", "left", "right"], { error: "must be up, down, left or right" }),
  amount: intIn(1, 50).optional(),
});
const Type = z.strictObject({
  type: z.literal("type"),
  text: z
    .string({ error: "must be a string" })
    .max(maxTypeChars, { error: `must be at most ${maxTypeChars} characters` })
    .refine((s) => !s.includes("\0"), { error: "must not hold a NUL character" }),
});
const Key = z.strictObject({ type: z.literal("key"), keys: z.string({ error: "must be a key combination such as ctrl+c" }).min(1).max(100) });
const Wait = z.strictObject({ type: z.literal("wait"), ms: intIn(0, maxWaitMs) });

export const DesktopAction = z
  .discriminatedUnion("type", [Move, Click, Drag, Scroll, Type, Key, Wait], {
    error: "must be an action: {type: move|click|double_click|drag|scroll|type|key|wait, …}",
  })
  .openapi("DesktopAction", {
    description: [
      "`move {x, y}`; `click` and `double_click {x?, y?, button?}` (at the cursor without x and y);",
      "`drag {startX, startY, x, y, button?}`; `scroll {direction: up|down|left|right, amount?: 1..50, x?, y?}`;",
      "`type {text}`; `key {keys}` (a combination such as `ctrl+c`, `enter`, `shift+Tab`); `wait {ms}` (at most 10000).",
      "Coordinates are pixels of the agent's display, (0, 0) its top left corner.",
    ].join(" "),
  });
export type DesktopActionInput = z.infer<typeof DesktopAction>;

export const ActionsBody = z
  .strictObject(
    {
      actions: z
        .array(DesktopAction, { error: "must be a list of actions" })
        .min(1, { error: "must hold at least one action" })
        .max(maxActions, { error: `must hold at most ${maxActions} actions` }),
      screenshot: z.boolean({ error: "must be true or false" }).optional().openapi({ description: "Answer the screen after the last action (default true)" }),
      scale: z
        .number({ error: "must be a number from 0.1 to 1" })
        .min(0.1, { error: "must be a number from 0.1 to 1" })
        .max(1, { error: "must be a number from 0.1 to 1" })
        .optional()
        .openapi({ description: "The screenshot's scale, 0.1 to 1 (default 1)" }),
    },
    { error: "must be a JSON object {actions, screenshot?, scale?}" },
  )
  .openapi("DesktopActions");

export const ActionsResultSchema = z
  .object({
    cursor: z.object({ x: z.number().int(), y: z.number().int() }).openapi({ description: "Where the pointer is after the last action" }),
    display: z.object({ width: z.number().int(), height: z.number().int() }),
    screenshot: z.string().nullable().openapi({
      description:
        "The screen after the last action as a base64 PNG, taken once nothing was drawn for 50 ms (at most 1 s later); null with `screenshot: false`",
    }),
    durationMs: z.number().int().openapi({ description: "The batch's time inside the VM, ms (its waits included)" }),
  })
  .openapi("DesktopActionsResult");

export const DesktopViewersSchema = z
  .object({
    viewers: z.array(
      z.object({
        id: z.string().openapi({ description: "The session (`dsk_…`)" }),
        mode: z.enum(["view", "control"]),
        actor: z.string().openapi({ description: "Who (the token's subject)" }),
        since: z.string().openapi({ format: "date-time" }),
      }),
    ),
  })
  .openapi("DesktopViewers");
