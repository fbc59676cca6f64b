// Lists follow the API's cursors: page after page until the last one, or until --limit items are in hand.
import { CliError, exitCodes } from "./exit.ts";

/** One page as every list answers it; a list that does not page (no `nextCursor`) is one page. */
export interface Page<T> {
  items: T[];
  nextCursor?: string | null | undefined;
}

export interface FollowOptions {
  /** Items asked for per page. */
  pageSize: number;
  /** Stop after this many items; undefined: all. */
  max?: number | undefined;
}

/** The items of every page, and the cursor after the last one shown (null when the list was followed to its end). */
export async function followPages<T>(
  page: (cursor: string | undefined, limit: number) => Promise<Page<T>>,
  opts: FollowOptions,
): Promise<{ items: T[]; nextCursor: string | null }> {
  const items: T[] = [];
  const seen = new Set<string>();
  let cursor: string | undefined;
  for (;;) {
    const want = opts.max === undefined ? opts.pageSize : Math.min(opts.pageSize, opts.max - items.length);
    if (want <= 0) return { items, nextCursor: cursor ?? null };
    const got = await page(cursor, want);
    const room = opts.max === undefined ? got.items.length : opts.max - items.length;
    items.push(...got.items.slice(0, room));
    const next = got.nextCursor ?? undefined;
    if (next === undefined) return { items, nextCursor: null };
    // A cursor given twice would page for ever: that is the server's fault, said as such.
    if (seen.has(next)) throw new CliError(exitCodes.server, `the gateway gave the cursor ${next.slice(0, 40)} twice: stopping`);
    seen.add(next);
    cursor = next;
  }
}
