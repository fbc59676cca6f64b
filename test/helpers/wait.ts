// Polls a condition until it holds (answers how long it took) or fails the test after `timeoutMs`.
export async function waitFor(pred: () => Promise<boolean> | boolean, timeoutMs: number, what = "condition"): Promise<number> {
  const started = Date.now();
  while (!(await pred())) {
    if (Date.now() - started > timeoutMs) throw new Error(`${what} not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return Date.now() - started;
}
