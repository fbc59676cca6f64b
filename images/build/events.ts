// What a build reports while it runs: instruction steps, raw log lines, and progress per phase.

export type BuildEvent =
  | { type: "step"; step: number; total: number; text: string }
  | { type: "log"; line: string }
  | { type: "progress"; phase: "base" | "build" | "export" | "unpack" | "rootfs"; bytes?: number; text?: string };
