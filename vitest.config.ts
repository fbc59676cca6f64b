// vitest: unit, integration (real Postgres from global setup) and end-to-end (real VMs) tests under test/.
//
// Two groups, one after the other: unit and integration tests two files at a time (each file has its own database
// and ports; they wait on sockets and Postgres more than they compute), with them the end-to-end tests that can run
// beside another file (test/e2e/parallel/: the process driver, no VM, nothing timed), then the other end-to-end tests
// one file at a time (real VMs under TCG take a core each, and several of them time what they measure).
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    globalSetup: ["test/helpers/global-setup.ts"],
    testTimeout: 60_000,
    hookTimeout: 180_000,
    pool: "forks",
    reporters: ["default"],
    projects: [
      {
        extends: true,
        test: {
          name: "parallel",
          include: ["test/unit/**/*.test.ts", "test/integration/**/*.test.ts", "test/e2e/parallel/**/*.test.ts"],
          maxWorkers: 2,
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: { name: "e2e", include: ["test/e2e/**/*.test.ts"], exclude: ["test/e2e/parallel/**"], maxWorkers: 1, sequence: { groupOrder: 1 } },
      },
    ],
  },
});
