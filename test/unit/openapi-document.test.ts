// /openapi.json is a valid OpenAPI 3.1 document that describes every route the gateway answers, and only those.
import { describe, expect, it } from "vitest";
import { Validator } from "@seriousme/openapi-schema-validator";
import { apiApp, apiDocument } from "../../compose/api-document.ts";

type Operation = { operationId?: string; responses?: Record<string, { content?: Record<string, { schema?: unknown }> }>; security?: unknown[] };
const methods = ["get", "put", "post", "delete", "patch", "head", "options"] as const;

/** `/v1/agents/:id/leases/:leaseId` as the document writes it. */
const asDocumentPath = (path: string) => path.replaceAll(/:([^/]+)/g, "{$1}");

/** What the app answers without describing it: only the document itself. */
const undocumented = new Set(["GET /openapi.json"]);

describe("the OpenAPI document", () => {
  const doc = apiDocument();
  const operations = Object.entries(doc.paths ?? {}).flatMap(([path, item]) =>
    methods
      .filter((m) => (item as Record<string, unknown>)[m])
      .map((m) => ({ key: `${m.toUpperCase()} ${path}`, op: (item as Record<string, Operation>)[m]! })),
  );

  it("validates as OpenAPI 3.1", async () => {
    const validator = new Validator();
    const res = await validator.validate(JSON.parse(JSON.stringify(doc)) as Parameters<Validator["validate"]>[0]);
    expect(res.errors ?? []).toEqual([]);
    expect(res.valid).toBe(true);
    expect(validator.version).toBe("3.1");
  });

  it("has every route of the app's route table, and nothing the app does not answer", () => {
    const routes = new Set(
      apiApp()
        .routes.filter((r) => r.method !== "ALL") // middleware (auth, request id, the proxy's catch-all)
        .map((r) => `${r.method} ${asDocumentPath(r.path)}`)
        .filter((k) => !undocumented.has(k)),
    );
    const described = new Set(operations.map((o) => o.key));
    expect(
      [...routes].filter((k) => !described.has(k)),
      "routes missing from the document",
    ).toEqual([]);
    expect(
      [...described].filter((k) => !routes.has(k)),
      "operations no route answers",
    ).toEqual([]);
    expect(routes.size).toBeGreaterThan(25);
  });

  it("names every operation once, and gives every error answer the one envelope", () => {
    const ids = operations.map((o) => o.op.operationId);
    expect(ids.filter((id) => !id)).toEqual([]);
    expect(new Set(ids).size).toBe(ids.length);
    for (const { key, op } of operations) {
      for (const [status, res] of Object.entries(op.responses ?? {})) {
        if (Number(status) < 400) continue;
        expect(JSON.stringify(res.content?.["application/json"]?.schema), `${key} ${status}`).toBe(JSON.stringify({ $ref: "#/components/schemas/Error" }));
      }
    }
    expect(doc.components?.schemas?.Error).toBeDefined();
  });
});
