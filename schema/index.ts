// Every table of the system, for drizzle's queries and drizzle-kit's migrations.
export * from "./core.ts";
export * from "./webhooks.ts";
export * from "./billing.ts";
export * from "./proxy.ts";
export * from "./images.ts";
export * from "./operations.ts";
