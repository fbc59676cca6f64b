// bench:pool's measurements, each through the TypeScript SDK over the public API: exec round trips, exec on a hibernated agent, reset to the next output, acquire, forks.
import { execFile } from "node:child_process";
import { type Agent, type AgentVM, AgentVMError, type Pool } from "../../../sdk/typescript/src/index.ts";
import { percentile, round } from "../figures.ts";

export interface Spread {
  n: number;
  p50: number;
  p99: number;
  min: number;
  max: number;
}

/** p50, p99, min and max of `xs`, ms to 0.1. */
export function spread(xs: readonly number[]): Spread {
  return { n: xs.length, p50: round(percentile(xs, 50), 1), p99: round(percentile(xs, 99), 1), min: round(Math.min(...xs), 1), max: round(Math.max(...xs), 1) };
}

const now = () => performance.now();

/** `n` round trips of `echo hi` on the host itself (execFile: fork, exec, pipes): what a process costs with no VM and no HTTP. */
export async function hostExec(n: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = now();
    await new Promise<void>((resolve, reject) =>
      execFile("echo", ["hi"], (err, out) => (err ? reject(err) : out === "hi\n" ? resolve() : reject(new Error(out)))),
    );
    times.push(now() - t0);
  }
  return times;
}

/**
 * `n` round trips of `echo hi` through the API on an awake agent (JSON answer: the call until its whole answer), with
 * what the exec server itself measured of each (`durationMs`: the command from its fork to its exit, in the VM).
 */
export async function warmExec(agent: Agent, n: number, cmd: string[] = ["echo", "hi"]): Promise<{ times: number[]; inVm: number[] }> {
  const first = await agent.exec(cmd); // wakes it if it sleeps: not counted
  if (first.stdout !== "hi\n") throw new Error(`exec answered ${JSON.stringify(first)}`);
  const times: number[] = [];
  const inVm: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = now();
    const r = await agent.exec(cmd);
    times.push(now() - t0);
    inVm.push(r.durationMs);
    if (r.stdout !== "hi\n") throw new Error(`exec answered ${JSON.stringify(r)}`);
  }
  return { times, inVm };
}

/** `n` proxied calls to the awake agent's own server (`GET /counter`): the same gateway → host → VM path without a process started. */
export async function warmCalls(agent: Agent, n: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = now();
    const r = await agent.fetch("/counter");
    await r.arrayBuffer();
    times.push(now() - t0);
    if (r.status !== 200) throw new Error(`GET /counter answered ${r.status}`);
  }
  return times;
}

/** From the call to the first stdout byte of a streamed `echo` (the call wakes the agent when it sleeps); the stream is read to its exit. */
export async function firstOutput(agent: Agent, word = "hi"): Promise<number> {
  const t0 = now();
  let first: number | undefined;
  for await (const e of agent.execStream(["echo", word])) {
    if ("stdout" in e) first ??= now() - t0;
    if ("exit" in e && e.exit.exitCode !== 0) throw new Error(`echo exited with ${JSON.stringify(e.exit)}`);
  }
  if (first === undefined) throw new Error("the stream ended without output");
  return first;
}

/**
 * Hibernates the agent, asking again while it answers 409 `conflict` (a call or exec just answered may still count as
 * in flight on the host for a moment after its last byte reached the client).
 */
export async function hibernateNow(agent: Agent): Promise<{ state: string }> {
  for (let i = 0; ; i++) {
    try {
      return await agent.hibernate();
    } catch (err) {
      if (!(err instanceof AgentVMError && err.code === "conflict") || i >= 40) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** `n` rounds of hibernate, then a streamed exec: its first output byte (a restore under it). */
export async function hibernatedExec(agent: Agent, n: number): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const slept = await hibernateNow(agent);
    if (slept.state !== "hibernated") throw new Error(`hibernate answered ${slept.state}`);
    times.push(await firstOutput(agent));
  }
  return times;
}

export interface ResetRound {
  /** The reset call until the next exec's first output byte: the episode boundary as a harness sees it. */
  toOutput: number;
  /** The reset call alone. */
  call: number;
  /** What the API said the roll-back took. */
  apiResetMs: number;
}

/**
 * `n` episodes on a fork: a file written (dirtied), the rest of the episode (`episodeMs` after its first exec: a
 * harness's model and tool turns), reset, the next exec's first output (checked: the file is gone).
 */
export async function resets(fork: Agent, n: number, episodeMs: number): Promise<ResetRound[]> {
  const rounds: ResetRound[] = [];
  await fork.exec(["true"]);
  for (let i = 0; i < n; i++) {
    const began = now();
    await fork.exec("echo dirty > /tmp/bench-episode");
    const left = episodeMs - (now() - began);
    if (left > 0) await new Promise((r) => setTimeout(r, left));
    const t0 = now();
    const r = await fork.reset();
    const call = now() - t0;
    let toOutput = Number.NaN;
    for await (const e of fork.execStream("test -e /tmp/bench-episode && echo dirty || echo clean")) {
      if ("stdout" in e) {
        toOutput = now() - t0;
        if (e.stdout !== "clean\n") throw new Error(`after a reset the episode's file is still there (${e.stdout.trim()})`);
      }
    }
    rounds.push({ toOutput, call, apiResetMs: r.resetMs });
  }
  return rounds;
}

/** Polls the pool until `ready` agents wait in it (or `timeoutMs`); answers the ms it took. */
export async function filled(pool: Pool, ready: number, timeoutMs: number): Promise<number> {
  const t0 = now();
  for (;;) {
    const p = await pool.refresh();
    if (p.ready >= ready) return now() - t0;
    if (now() - t0 > timeoutMs) throw new Error(`pool ${pool.id}: ${p.ready} of ${ready} ready after ${timeoutMs} ms (resetting ${p.resetting})`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export interface AcquireRound {
  /** The acquire call. */
  acquire: number;
  /** Acquire until the agent's first exec output (it wakes from the checkpoint). */
  toOutput: number;
  forked: boolean;
}

/** `n` acquires one after another from a full pool, each followed by a streamed exec; the agents are answered for release. */
export async function acquires(pool: Pool, n: number): Promise<{ rounds: AcquireRound[]; agents: Agent[] }> {
  const rounds: AcquireRound[] = [];
  const agents: Agent[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = now();
    const agent = await pool.acquire();
    const acquire = now() - t0;
    agents.push(agent);
    const out = await firstOutput(agent);
    rounds.push({ acquire, toOutput: acquire + out, forked: false });
  }
  return { rounds, agents };
}

/** `n` forks of one checkpoint created through the API, `concurrency` at a time: forks per second (each hibernated on the checkpoint). */
export async function forks(client: AgentVM, checkpointId: string, n: number, concurrency: number): Promise<{ perSecond: number; ms: number; ids: string[] }> {
  const ids: string[] = [];
  let next = 0;
  const t0 = now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        next++;
        ids.push((await client.agents.create({ fromCheckpoint: checkpointId, name: "bench-fork" })).id);
      }
    }),
  );
  const ms = now() - t0;
  return { perSecond: round((n / ms) * 1000, 1), ms: round(ms, 0), ids };
}
