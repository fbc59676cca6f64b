// The CLI's typed client cannot drift from the API: contracts/api/openapi.json and contracts/api/types.ts are what the code describes now.
import { describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { apiDocument } from "../../compose/api-document.ts";

const script = fileURLToPath(new URL("../../scripts/openapi.ts", import.meta.url));

function openapi(args: string[]): Promise<{ code: number; out: string; err: string }> {
  return new Promise((resolve) =>
    execFile(process.execPath, [script, ...args], (error, out, err) => resolve({ code: error ? Number(error.code ?? 1) : 0, out, err })),
  );
}

describe("npm run openapi", () => {
  it("--check passes on the committed document and types (run `npm run openapi` after changing a route)", async () => {
    const r = await openapi(["--check"]);
    expect(r.err).toBe("");
    expect(r.code).toBe(0);
  }, 60_000);

  it("--check fails, naming the file, when either differs from what the code describes", async () => {
    const dir = mkdtempSync(join(tmpdir(), "agentvm-openapi-"));
    try {
      expect((await openapi(["--dir", dir])).code).toBe(0);
      expect((await openapi(["--check", "--dir", dir])).code).toBe(0);
      const types = join(dir, "types.ts");
      writeFileSync(types, readFileSync(types, "utf8").replace('"/v1/agents": {', '"/v1/agentz": {'));
      const stale = await openapi(["--check", "--dir", dir]);
      expect(stale.code).toBe(1);
      expect(stale.err).toContain(`${types} is not what the code describes`);
      expect(stale.err).not.toContain("openapi.json");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);

  it("is the running gateway's document: built over inert parts it touches none, and lists the routes the CLI calls", () => {
    const doc = apiDocument(); // the inert db, fleet, auth and builder throw on any use
    const paths = Object.keys(doc.paths ?? {});
    for (const p of [
      "/v1/agents",
      "/v1/agents/{id}",
      "/v1/agents/{id}/wake",
      "/v1/agents/{id}/logs",
      "/v1/agents/{id}/events",
      "/v1/usage",
      "/v1/invoices",
      "/v1/images",
    ])
      expect(paths).toContain(p);
    expect(doc.openapi).toBe("3.1.0");
    const committed = JSON.parse(readFileSync(fileURLToPath(new URL("../../contracts/api/openapi.json", import.meta.url)), "utf8")) as unknown;
    expect(committed).toEqual(JSON.parse(JSON.stringify(doc)));
  });
});
