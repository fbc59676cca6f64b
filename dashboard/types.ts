// The API's answers as the dashboard reads them: the types generated from the OpenAPI document, so they cannot drift.
import type { components } from "../contracts/api/types.ts";

type Schemas = components["schemas"];

export type Agent = Schemas["Agent"];
export type Run = Schemas["Run"];
export type RunsPage = Schemas["RunPage"];
export type UsageReport = Schemas["Usage"];
export type UsageRow = UsageReport["rows"][number];
export type Rates = Schemas["Rates"];
export type InvoiceLine = Schemas["Invoice"]["lines"][number];
export type Invoice = Schemas["Invoice"];
export type Operation = Schemas["Operation"];
export type OperationsPage = Schemas["OperationList"];
export type Pool = Schemas["Pool"];
export type PoolList = Schemas["PoolList"];
export type DesktopViewers = Schemas["DesktopViewers"];
