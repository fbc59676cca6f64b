// drizzle-kit: generates SQL migrations from schema/ into schema/migrations (committed, applied at start).
import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "postgresql",
  schema: "./schema/index.ts",
  out: "./schema/migrations",
});
