// vitest global setup: one Postgres server for the whole run; each test file makes its own database in it.
import type { TestProject } from "vitest/node";
import { startPostgres, type PgServer } from "../../scripts/postgres-server.ts";

let server: PgServer | undefined;

export async function setup(project: TestProject): Promise<void> {
  server = await startPostgres();
  project.provide("pgUrl", server.url);
}

export async function teardown(): Promise<void> {
  await server?.stop();
}

declare module "vitest" {
  export interface ProvidedContext {
    pgUrl: string;
  }
}
