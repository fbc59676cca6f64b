// `agentvm` against a real system (process driver, real Postgres, real sockets), run as a child process the way a user runs it.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort } from "../../../scripts/postgres-server.ts";
import { startSystem, type TestSystem } from "../../helpers/system.ts";
import { waitFor } from "../../helpers/wait.ts";

const bin = fileURLToPath(new URL("../../../bin/agentvm.js", import.meta.url));
const printer = [process.execPath, fileURLToPath(new URL("../../helpers/workloads/printer.ts", import.meta.url))];

interface Run {
  code: number;
  out: string;
  err: string;
}

let sys: TestSystem;
let home: string;

/** `node bin/agentvm.js …` with the system's URL and the demo token in the environment, and a home of its own (no config file). */
function agentvm(args: string[], opts: { env?: Record<string, string>; node?: string } = {}): Promise<Run> {
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home, AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token, ...opts.env };
  return new Promise((resolve) => {
    execFile(opts.node ?? process.execPath, [bin, ...args], { env, timeout: 60_000 }, (error, out, err) =>
      resolve({ code: error ? Number(error.code ?? 1) : 0, out, err }),
    );
  });
}

const json = <T>(r: Run): T => {
  expect(r.code, r.err).toBe(0);
  return JSON.parse(r.out) as T;
};

const day = (offsetDays: number) => new Date(Date.now() + offsetDays * 86_400_000).toISOString().slice(0, 10);

beforeAll(async () => {
  sys = await startSystem({ images: { printer } });
  home = mkdtempSync(join(tmpdir(), "agentvm-cli-home-"));
});
afterAll(async () => {
  await sys?.stop();
  if (home) rmSync(home, { recursive: true, force: true });
});

describe("agentvm: one agent's life", () => {
  it("create → ls → wake (boot) → show → lease → events → logs → hibernate → usage → rm", async () => {
    const created = await agentvm(["agents", "create", "--name", "cli-life", "--idle-timeout", "5m", "--mem", "256"]);
    expect(created.code, created.err).toBe(0);
    const id = created.out.trim();
    expect(id).toMatch(/^agt_\w+$/);

    const table = await agentvm(["agents", "ls"]);
    expect(table.code).toBe(0);
    const lines = table.out.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^ID\s+NAME\s+IMAGE\s+STATE\s+VCPUS\s+MEM\s+LEASES\s+LAST WAKE$/);
    expect(lines.find((l) => l.startsWith(id))).toMatch(new RegExp(`^${id}\\s+cli-life\\s+demo\\s+creating\\s+1\\s+256 MiB\\s+0$`));
    const listed = json<{ agents: { id: string; name: string }[]; nextCursor: null }>(await agentvm(["agents", "ls", "--json", "--name-prefix", "cli-life"]));
    expect(listed).toMatchObject({ agents: [{ id, name: "cli-life" }], nextCursor: null });

    const woke = await agentvm(["agents", "wake", id]);
    expect(woke.code, woke.err).toBe(0);
    expect(woke.out).toMatch(new RegExp(`^${id} running \\(wake boot, run run_\\w+\\) in [\\d.]+ m?s: .*boot \\d+ ms`));
    expect(woke.err).toContain(`waking ${id}`); // progress, on stderr

    const shown = await agentvm(["agents", "show", id]);
    expect(shown.out).toMatch(/^state\s+running$/m);
    expect(shown.out).toContain(`${sys.url}/a/${id}/`);
    expect(json<{ state: string }>(await agentvm(["agents", "show", id, "--json"])).state).toBe("running");

    const lease = await agentvm(["agents", "lease", id, "--ttl", "30s"]);
    expect(lease.code, lease.err).toBe(0);
    expect(lease.out).toMatch(new RegExp(`^lease lse_\\w+ keeps ${id} awake until \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\dZ\\n$`));
    expect(json<{ leases: number }>(await agentvm(["agents", "show", id, "--json"])).leases).toBe(1);

    const events = await agentvm(["events", id]);
    expect(events.out.split("\n")[0]).toMatch(/^AT\s+FROM\s+TO\s+REASON\s+RUN\s+TIMINGS$/);
    expect(events.out).toMatch(/booting\s+running\s+api\s+run_\w+\s+.*boot=\d+/);
    const eventsJson = json<{ events: { toState: string; reason: string }[] }>(await agentvm(["events", id, "--json", "--since", "1h"]));
    expect(eventsJson.events.map((e) => e.toState)).toEqual(["running", "booting"]); // newest first
    expect(json<{ events: unknown[] }>(await agentvm(["events", id, "--json", "--until", "2000-01-01T00:00:00Z"])).events).toEqual([]);

    const logs = await agentvm(["logs", id, "--tail", "4096"]);
    expect(logs.code, logs.err).toBe(0);
    expect(logs.out).toMatch(/^demo agent listening on 127\.0\.0\.1:\d+\n/);
    const logLines = (await agentvm(["logs", id, "--json"])).out
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { line: string });
    expect(logLines[0]!.line).toMatch(/^demo agent listening on/);

    const slept = await agentvm(["agents", "hibernate", id]);
    expect(slept.code, slept.err).toBe(0);
    expect(slept.out).toBe(`${id} hibernated\n`);
    const range = ["--from", day(-1), "--to", day(2), "--group-by", "agent"];
    // The meter ships the closed segment to billing in the background: wait until billing has it.
    await waitFor(
      async () => {
        const r = (await (await sys.call(`/v1/usage?from=${day(-1)}&to=${day(2)}&agentId=${id}`)).json()) as { totals: { activeMs: number } };
        return r.totals.activeMs > 0;
      },
      10_000,
      "billing to have the agent's segment",
    );
    const usage = json<{ rows: { agentId: string; activeMs: number }[]; totals: { activeMs: number } }>(await agentvm(["usage", ...range, "--json"]));
    const mine = usage.rows.find((r) => r.agentId === id);
    expect(mine?.activeMs).toBeGreaterThan(0);
    const csv = await agentvm(["usage", ...range, "--csv"]);
    expect(csv.code).toBe(0);
    expect(csv.out.split("\r\n")[0]).toBe(
      "window_start,window_end,agent_id,active_ms,vcpu_ms,mib_ms,dozed_ms,dozed_vcpu_ms,dozed_mib_ms,hibernated_ms,pool_id",
    );
    // The same agent's row; its active time at least what the JSON said (a segment shipped since may have added to it).
    const row = csv.out.split("\r\n").find((l) => l.includes(`,${id},`));
    expect(Number(row?.split(",")[3])).toBeGreaterThanOrEqual(mine!.activeMs);
    const usageTable = await agentvm(["usage", ...range, "--zone", "Europe/Paris"]);
    expect(usageTable.out).toMatch(new RegExp(`^\\S+\\+0[12]:00\\s+${id}\\s+\\d+\\.\\d{3}\\s+`, "m"));
    expect(usageTable.out).toMatch(/\(time zone Europe\/Paris, from .*\)\n$/);

    const removed = await agentvm(["agents", "rm", id]);
    expect(removed.out).toBe(`deleted ${id}\n`);
    const gone = await agentvm(["agents", "show", id]);
    expect(gone.code).toBe(1);
    expect(gone.out).toBe("");
    expect(gone.err).toMatch(new RegExp(`^error not_found: agent ${id} not found \\(request req_\\w+\\)\\n$`));
  }, 120_000);
});

describe("agentvm: what scripts rely on", () => {
  it("follows cursors: with a page size of 2 it lists every agent; --limit stops early with the cursor to go on", async () => {
    for (let i = 0; i < 5; i++) await sys.createAgent({ name: `paged-${i}` });
    const firstPage = (await (await sys.call("/v1/agents?limit=2&namePrefix=paged-")).json()) as { agents: unknown[]; nextCursor: string | null };
    expect(firstPage.agents).toHaveLength(2);
    expect(firstPage.nextCursor).not.toBeNull();
    const all = json<{ agents: { name: string }[]; nextCursor: null }>(
      await agentvm(["agents", "ls", "--json", "--name-prefix", "paged-"], { env: { AGENTVM_PAGE_SIZE: "2" } }),
    );
    expect(all.agents.map((a) => a.name)).toEqual(["paged-0", "paged-1", "paged-2", "paged-3", "paged-4"]);
    expect(all.nextCursor).toBeNull();
    const some = json<{ agents: { name: string }[]; nextCursor: string | null }>(
      await agentvm(["agents", "ls", "--json", "--name-prefix", "paged-", "--page-size", "2", "--limit", "3"]),
    );
    expect(some.agents.map((a) => a.name)).toEqual(["paged-0", "paged-1", "paged-2"]);
    expect(some.nextCursor).not.toBeNull();
    const table = await agentvm(["agents", "ls", "--name-prefix", "paged-"], { env: { AGENTVM_PAGE_SIZE: "1" } });
    expect(table.out.trimEnd().split("\n")).toHaveLength(6); // header + 5
  }, 60_000);

  it("create --wait prints only the new id on stdout (the wake's summary and progress go to stderr)", async () => {
    const created = await agentvm(["agents", "create", "--name", "cli-wait", "--wait"]);
    expect(created.code, created.err).toBe(0);
    expect(created.out).toMatch(/^agt_\w+\n$/);
    const id = created.out.trim();
    expect(created.err).toMatch(new RegExp(`^${id} running \\(wake boot, run run_\\w+\\)`, "m"));
    expect(json<{ state: string }>(await agentvm(["agents", "show", id, "--json"])).state).toBe("running");
  }, 60_000);

  // The machine's own Node (20 here) runs bin/agentvm.js, which re-executes under the project's Node: a terminal's Ctrl-C
  // then reaches both processes and the parent passes it on, so the follow gets SIGINT twice.
  const nodes = [process.execPath, ...(existsSync("/usr/bin/node") ? ["/usr/bin/node"] : [])];
  it.each(nodes)(
    "logs -f (under %s) prints what the agent writes next, as lines, and exits 0 on a terminal's Ctrl-C",
    async (node) => {
      const agent = await sys.createAgent({ image: "printer" });
      const print = async (text: string) => expect((await sys.call(`/a/${agent.id}/print?text=${text}`, { method: "POST" })).status).toBe(200);
      await print("before");
      const child = spawn(node, [bin, "logs", agent.id, "-f", "--tail", "0"], {
        env: { PATH: process.env.PATH ?? "", HOME: home, AGENTVM_URL: sys.url, AGENTVM_TOKEN: sys.demo.token },
        stdio: ["ignore", "pipe", "pipe"],
        detached: true, // its own process group, as a terminal's foreground job is
      });
      let out = "";
      child.stdout.on("data", (d: Buffer) => (out += d.toString()));
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      // The follow is open once a line printed after it started arrives; until then each try prints another.
      let n = 0;
      await waitFor(
        async () => {
          await print(`follow-${++n}`);
          await new Promise((r) => setTimeout(r, 200));
          return out.includes("follow-");
        },
        20_000,
        "the follow printing a new line",
      );
      expect(out).not.toContain("before");
      expect(out).toMatch(/^(follow-\d+\n)+$/);
      process.kill(-child.pid!, "SIGINT"); // the terminal signals the whole group
      expect(await exited).toBe(0);
    },
    40_000,
  );

  it("exits 3 when the gateway cannot be reached, 2 on a usage error, 5 when a wait times out", async () => {
    const port = await freePort(); // nothing listens there
    const unreachable = await agentvm(["agents", "ls"], { env: { AGENTVM_URL: `http://127.0.0.1:${port}` } });
    expect(unreachable.code).toBe(3);
    expect(unreachable.err).toMatch(new RegExp(`^cannot reach the gateway at http://127\\.0\\.0\\.1:${port} \\(ECONNREFUSED; the URL is from AGENTVM_URL\\)`));
    const noTtl = await agentvm(["agents", "lease", "agt_x"]);
    expect(noTtl.code).toBe(2);
    expect(noTtl.err).toContain("required option '--ttl <duration>' not specified");
    expect((await agentvm(["agents", "lease", "agt_x", "--ttl", "soon"])).code).toBe(2);
    expect((await agentvm(["nonsense"])).code).toBe(2);
    const noToken = await agentvm(["agents", "ls"], { env: { AGENTVM_TOKEN: "" } });
    expect(noToken.code).toBe(2);
    expect(noToken.err).toMatch(/^no token: pass --token, set AGENTVM_TOKEN, or run `agentvm login/);
    const badToken = await agentvm(["agents", "ls"], { env: { AGENTVM_TOKEN: "nope" } });
    expect(badToken.code).toBe(1);
    expect(badToken.err).toMatch(/^error unauthorized: .* \(request req_\w+\)$/m);
    const sleeper = await sys.createAgent();
    const late = await agentvm(["agents", "wake", sleeper.id, "--timeout", "1ms"]);
    expect(late.code).toBe(5);
    expect(late.err).toMatch(/timed out/);
  }, 60_000);

  it("login keeps the URL and token in a 0600 file that later commands use; tenants reads the token's tenant", async () => {
    const login = await agentvm(["login", "--url", sys.url, "--token", sys.demo.token], { env: { AGENTVM_URL: "", AGENTVM_TOKEN: "" } });
    expect(login.code, login.err).toBe(0);
    const file = join(home, ".config", "agentvm", "config.json");
    expect(login.out).toBe(`saved ${sys.url} (tenant ${sys.demo.tenantId}) to ${file}\n`);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const fromFile = await agentvm(["agents", "ls", "--json"], { env: { AGENTVM_URL: "", AGENTVM_TOKEN: "" } });
    expect(json<{ agents: { id: string }[] }>(fromFile).agents.some((a) => a.id === sys.demo.agentId)).toBe(true);
    const tenants = await agentvm(["tenants"], { env: { AGENTVM_URL: "", AGENTVM_TOKEN: "" } });
    expect(tenants.out).toMatch(new RegExp(`^tenant\\s+${sys.demo.tenantId}$`, "m"));
    expect(tenants.out).toMatch(/^scopes\s+agents:invoke agents:admin agents:exec images:read images:write usage:read$/m);
    rmSync(join(home, ".config"), { recursive: true, force: true });
  });

  it("mints a token the gateway takes with the system's dev key", async () => {
    const minted = await agentvm(["token", "--tenant", sys.demo.tenantId, "--scopes", "agents:admin", "--ttl", "10m", "--data-dir", sys.dataDir]);
    expect(minted.code, minted.err).toBe(0);
    const token = minted.out.trim();
    expect(json<{ agents: unknown[] }>(await agentvm(["agents", "ls", "--json"], { env: { AGENTVM_TOKEN: token } })).agents.length).toBeGreaterThan(0);
    const noUsage = await agentvm(["usage", "--json"], { env: { AGENTVM_TOKEN: token } });
    expect(noUsage.code).toBe(1);
    expect(noUsage.err).toMatch(/^error forbidden: .*usage:read/);
  });
});

describe("agentvm images (real buildah)", () => {
  it("build shows the build's progress and prints the image; ls lists it; a bad build and a bad archive exit 1; rm deletes", async () => {
    const ctx = mkdtempSync(join(tmpdir(), "agentvm-cli-ctx-"));
    try {
      mkdirSync(join(ctx, "root", "www"), { recursive: true });
      writeFileSync(join(ctx, "root", "www", "index.html"), "hello\n");
      writeFileSync(join(ctx, "Containerfile"), 'FROM scratch\nCOPY root/ /\nCMD ["/bin/sh"]\n');
      writeFileSync(join(ctx, "Broken"), "FROM scratch\nFROBNICATE x\n");
      const built = await agentvm(["images", "build", ctx, "--name", "cli-tiny:v1"]);
      expect(built.code, built.err).toBe(0);
      expect(built.out).toMatch(/^image (img_\w+) cli-tiny:v1 sha256:[0-9a-f]{64} [\d.]+ MiB in [\d.]+ m?s\n$/);
      expect(built.err).toContain("STEP 2/3: COPY root/ /");
      expect(built.err).toMatch(/^\[rootfs\] /m);
      const imageId = /^image (img_\w+)/.exec(built.out)![1]!;

      const ls = await agentvm(["images", "ls"]);
      expect(ls.out).toMatch(new RegExp(`^${imageId}\\s+cli-tiny:v1\\s+sha256:[0-9a-f]{12}\\s+[\\d.]+ MiB\\s+\\d{4}-`, "m"));
      const events = (await agentvm(["images", "build", ctx, "--name", "cli-tiny:v2", "--json"])).out
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as { type: string });
      expect(events[0]!.type).toBe("build");
      expect(events.at(-1)!.type).toBe("image");

      const broken = await agentvm(["images", "build", ctx, "--name", "cli-broken", "--file", "Broken"]);
      expect(broken.code).toBe(1);
      expect(broken.err).toMatch(/^error build_failed: .*FROBNICATE/ms);
      expect(broken.err).toMatch(/\(request req_\w+\)\n$/);
      const notArchive = await agentvm(["images", "import", join(ctx, "Containerfile"), "--name", "cli-junk"]);
      expect(notArchive.code).toBe(1);
      expect(notArchive.err).toMatch(/^error bad_archive: /m);

      expect((await agentvm(["images", "rm", imageId])).out).toMatch(new RegExp(`^deleted ${imageId}`));
      expect(json<{ images: { id: string }[] }>(await agentvm(["images", "ls", "--json"])).images.map((i) => i.id)).not.toContain(imageId);
    } finally {
      rmSync(ctx, { recursive: true, force: true });
    }
  }, 180_000);
});

/** The machine's own Node, when it is one that cannot run TypeScript itself (the launcher must hand over to Node 24). */
function oldNode(): string | undefined {
  const node = "/usr/bin/node";
  if (!existsSync(node)) return undefined;
  const [major = 0, minor = 0] = execFileSync(node, ["-p", "process.versions.node"], { encoding: "utf8" }).trim().split(".").map(Number);
  return major < 22 || (major === 22 && minor < 18) ? node : undefined;
}

describe("bin/agentvm.js on an old Node", () => {
  const node = oldNode();
  const what = "re-executes cli/main.ts with the project's Node 24, passing args, output and the exit code through";
  it.skipIf(!node)(node ? `${what} (${node})` : `${what} (skipped: no Node older than 22.18 at /usr/bin/node)`, async () => {
    const listed = await agentvm(["agents", "ls", "--json"], { node: node! });
    expect(json<{ agents: { id: string }[] }>(listed).agents.some((a) => a.id === sys.demo.agentId)).toBe(true);
    const missing = await agentvm(["agents", "show", "agt_nothere0000000"], { node: node! });
    expect(missing.code).toBe(1);
    expect(missing.err).toMatch(/^error not_found: /);
    expect((await agentvm(["--bogus"], { node: node! })).code).toBe(2);
  });
});
