// The Python SDK's own unit tests (sdk/python/tests, standard unittest against a fake gateway), run by vitest so npm test runs them.
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const dir = fileURLToPath(new URL("../../sdk/python/", import.meta.url));

describe("the Python SDK (unittest)", () => {
  it("passes its unit tests with the machine's python3", async () => {
    const r = await new Promise<{ code: number; out: string }>((resolve) =>
      execFile(
        "python3",
        ["-m", "unittest", "-v", "tests.test_client"],
        { cwd: dir, env: { PATH: process.env.PATH ?? "/usr/bin:/bin", PYTHONDONTWRITEBYTECODE: "1" } },
        (err, stdout, stderr) => resolve({ code: err ? Number(err.code ?? 1) : 0, out: stdout + stderr }),
      ),
    );
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/Ran \d+ tests/);
    expect(r.out).toMatch(/\nOK\n/);
  });
});
