// `wrangler deploy --dry-run` bundles the gateway Worker from wrangler.toml without an account; the bundle holds no Node-only code.
import { describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { gzipSync } from "node:zlib";
import { repoRoot } from "../helpers/worker-stack.ts";

const run = promisify(execFile);

describe("Worker bundle", () => {
  it("builds with wrangler, small, without PGlite, undici or the host code", async () => {
    const outdir = mkdtempSync(join(tmpdir(), "agentvm-worker-"));
    try {
      const wrangler = join(repoRoot, "node_modules", "wrangler", "bin", "wrangler.js");
      const { stdout } = await run(process.execPath, [wrangler, "deploy", "--dry-run", "--outdir", outdir], {
        cwd: repoRoot,
        env: { ...process.env, WRANGLER_SEND_METRICS: "false", CLOUDFLARE_CF_FETCH_ENABLED: "false", CI: "true" },
      });
      expect(stdout).toMatch(/--dry-run: exiting now/);
      expect(stdout).toMatch(/env\.HYPERDRIVE/);
      const bundle = readFileSync(join(outdir, "worker.js"));
      const gzipped = gzipSync(bundle).byteLength;
      console.log(`worker bundle: ${(bundle.byteLength / 1024).toFixed(1)} KiB, ${(gzipped / 1024).toFixed(1)} KiB gzipped`);
      // Workers' smallest plan takes 3 MB compressed; this gateway is far below it.
      expect(gzipped).toBeLessThan(1024 * 1024);
      const sources = (JSON.parse(readFileSync(join(outdir, "worker.js.map"), "utf8")) as { sources: string[] }).sources;
      expect(sources.some((s) => s.includes("compose/worker.ts"))).toBe(true);
      expect(sources.some((s) => s.includes("gateway/remote-fleet.ts"))).toBe(true);
      for (const nodeOnly of [
        "@electric-sql/pglite",
        "node_modules/undici",
        "fleet-agent/host.ts",
        "fleet-agent/local-fleet.ts",
        "gateway/node/",
        "@hono/node-server",
      ]) {
        expect(
          sources.filter((s) => s.includes(nodeOnly)),
          nodeOnly,
        ).toEqual([]);
      }
    } finally {
      rmSync(outdir, { recursive: true, force: true });
    }
  });
});
