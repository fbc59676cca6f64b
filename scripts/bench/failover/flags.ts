// bench:failover's command line: its flags, as the BENCH_* variables they stand for.

/** `--rounds 5` / `--rounds=5` and the rest, as the BENCH_* variables they stand for (a flag wins). */
export function flagsOverEnv(argv: readonly string[], env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const names: Record<string, string> = {
    rounds: "BENCH_ROUNDS",
    "agents-per-host": "BENCH_AGENTS_PER_HOST",
    "lease-ms": "BENCH_LEASE_MS",
    "heartbeat-ms": "BENCH_HEARTBEAT_MS",
    "answer-timeout-ms": "BENCH_ANSWER_TIMEOUT_MS",
  };
  const out = { ...env };
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(argv[i]!);
    const name = m && names[m[1]!];
    if (!name)
      throw new Error(
        `unknown argument ${argv[i]} (flags: ${Object.keys(names)
          .map((n) => `--${n}`)
          .join(", ")})`,
      );
    out[name] = m[2] ?? argv[++i];
  }
  return out;
}
