// A gate in front of postgres.js: while the database is known to be down, queries fail at once instead of queueing behind connection attempts.
//
// postgres.js queues a query that finds no open connection and hands the queue to connection attempts one query per
// attempt, each after its backoff: with the server down, N queued queries wait about N × backoff / pool size (measured:
// 6 queries every 100 ms on a pool of 10 waited 2.1 s at the median and 4.8 s at most; on a pool of 1, 84 s), and with a
// server that drops packets each attempt takes the whole connect timeout. Behind the gate, once a query failed because
// the database is unavailable, one query at a time goes through as the probe and every other fails at once with
// `DATABASE_UNAVAILABLE` (503 database_unavailable to a caller); the first answer from the server opens the gate again.
import { gateClosedCode, isConnectionLost, isDatabaseUnavailable } from "./db-errors.ts";

/** The parts of a postgres.js client the gate looks at: drizzle calls `unsafe` for queries, `begin` for transactions. */
interface Client {
  unsafe(...args: unknown[]): PromiseLike<unknown> & { values(): unknown };
  begin(...args: unknown[]): Promise<unknown>;
}

/**
 * `client` behind a gate: what drizzle is given. A probe that has not settled after `probeTimeoutMs` (a server that
 * swallows packets on an open connection) lets the next query probe as well.
 */
export function gatedClient<C extends object>(client: C, probeTimeoutMs: number): C {
  const inner = client as unknown as Client;
  /** The last query failed as unavailable, and no answer came since. */
  let down = false;
  /** When the probe in flight started (performance.now()), or undefined. */
  let probing: number | undefined;

  const closedError = () => Object.assign(new Error("the database is unavailable (the last attempt to reach it failed; retrying)"), { code: gateClosedCode });

  /** Whether a query may go to the driver now, and whether it is the probe. */
  function admit(): { go: boolean; probe: boolean } {
    if (!down) return { go: true, probe: false };
    const now = performance.now();
    if (probing !== undefined && now - probing < probeTimeoutMs) return { go: false, probe: false };
    probing = now;
    return { go: true, probe: true };
  }

  function settled(err: unknown, probe: boolean): void {
    if (probe) probing = undefined;
    // Any answer of the server (an error of the query included) says it is back.
    down = err !== undefined && isDatabaseUnavailable(err);
  }

  function observe<T>(p: PromiseLike<T>, probe: boolean): Promise<T> {
    return Promise.resolve(p).then(
      (v) => {
        settled(undefined, probe);
        return v;
      },
      (err: unknown) => {
        settled(err, probe);
        throw err;
      },
    );
  }

  function unsafe(...args: unknown[]): PromiseLike<unknown> & { values(): unknown } {
    const { go, probe } = admit();
    if (!go) return failedQuery(closedError());
    const query = inner.unsafe(...args);
    // postgres.js runs a query when it is awaited; `.values()` only sets how rows come back.
    const view: PromiseLike<unknown> & { values(): unknown } = {
      values() {
        query.values();
        return view;
      },
      then(onFulfilled, onRejected) {
        return observe(query, probe).then(onFulfilled, onRejected);
      },
    };
    return view;
  }

  function begin(...args: unknown[]): Promise<unknown> {
    const { go, probe } = admit();
    if (!go) return Promise.reject(closedError());
    const fn = args.pop() as (sql: object) => unknown;
    const tx = { lost: false };
    const run = (sql: object) =>
      Promise.resolve(fn(lostAware(sql, tx))).catch((err: unknown) => {
        if (!tx.lost && !isConnectionLost(err)) throw err;
        tx.lost = true;
        return never; // no `rollback` on a connection that is gone (see below)
      });
    const done = inner.begin(...args, run).catch((err: unknown) => {
      if (isConnectionLost(err)) tx.lost = true;
      throw err;
    });
    return observe(done, probe);
  }

  return new Proxy(client, {
    get(target, name, receiver) {
      if (name === "unsafe") return unsafe;
      if (name === "begin") return begin;
      return Reflect.get(target, name, receiver) as unknown;
    },
  });
}

/**
 * postgres.js 3.4.x sends `rollback` on a transaction's connection after that connection closed, and its deferred write
 * then throws `TypeError: Cannot read properties of null (reading 'write')` from a timer, which ends the process
 * (porsager/postgres#1066, #1154, #1208; reproduced here: transactions under load, the server stopped, the process exited
 * on the first stop). So once a transaction's connection is gone, nothing more is sent on it: the transaction's callback
 * never settles (postgres.js then never reaches its rollback; the server rolled back already) and its further queries
 * are never sent, while `begin` itself rejects as soon as the connection closes.
 */
const never = new Promise<never>(() => {});
const neverQuery: PromiseLike<never> & { values(): unknown } = { then: (f, r) => never.then(f, r), values: () => neverQuery };

function lostAware<S extends object>(sql: S, tx: { lost: boolean }): S {
  return new Proxy(sql, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver) as unknown;
      if (name !== "unsafe" || typeof value !== "function") return value;
      return (...args: unknown[]) => (tx.lost ? neverQuery : (value as (...a: unknown[]) => unknown).apply(target, args));
    },
  });
}

/** A query that fails without reaching the driver, shaped like one (`.values()`, awaitable). */
function failedQuery(err: Error): PromiseLike<never> & { values(): unknown } {
  const view: PromiseLike<never> & { values(): unknown } = {
    values: () => view,
    then: (onFulfilled, onRejected) => Promise.reject(err).then(onFulfilled, onRejected),
  };
  return view;
}
