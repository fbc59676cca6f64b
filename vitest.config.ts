// vitest: unit, integration (real Postgres from global setup) and end-to-end (real VMs) tests under test/.
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/helpers/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 180_000,
    pool: "forks",
    reporters: ["default"],
  },
});
