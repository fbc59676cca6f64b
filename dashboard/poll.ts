// Loads a page's data now and again every few seconds (never two loads at once; none while the tab is hidden).
import { useEffect, useRef, useState } from "preact/hooks";

/** How often the pages refresh what they show, ms. */
export const refreshMs = 2000;

export interface Polled<T> {
  data: T | undefined;
  error: Error | undefined;
}

/** `load` runs at once, whenever `deps` change, and every `everyMs`; the last success stays shown while a later load fails. */
export function usePoll<T>(load: () => Promise<T>, deps: unknown[], everyMs = refreshMs): Polled<T> {
  const [state, setState] = useState<Polled<T>>({ data: undefined, error: undefined });
  const latest = useRef(load);
  latest.current = load;
  useEffect(() => {
    let stopped = false;
    let running = false;
    let loaded = false;
    setState({ data: undefined, error: undefined });
    const tick = async () => {
      if (running || (document.hidden && loaded)) return;
      running = true;
      try {
        const data = await latest.current();
        loaded = true;
        if (!stopped) setState({ data, error: undefined });
      } catch (err) {
        if (!stopped) setState((s) => ({ data: s.data, error: err instanceof Error ? err : new Error(String(err)) }));
      } finally {
        running = false;
      }
    };
    void tick();
    const timer = setInterval(() => void tick(), everyMs);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, deps);
  return state;
}
