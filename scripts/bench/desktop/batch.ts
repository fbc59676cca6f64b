// The 10-action batch whose latency bench:desktop and the desktop e2e test measure: moves, a click, typing, keys, a scroll (the typed text is wiped with ctrl+u, so the terminal is as it was).
export const latencyBatch = [
  { type: "move", x: 100, y: 100 },
  { type: "click", x: 400, y: 300 },
  { type: "type", text: "echo x" },
  { type: "key", keys: "ctrl+u" },
  { type: "move", x: 200, y: 200 },
  { type: "scroll", direction: "down", amount: 2 },
  { type: "move", x: 300, y: 300 },
  { type: "type", text: "ok" },
  { type: "key", keys: "ctrl+u" },
  { type: "move", x: 400, y: 300 },
] as const;
