// The fuzzer's route table: every operation of the OpenAPI document the running gateway serves, references resolved.

/** A JSON Schema as the document holds it (after `$ref`s are resolved). */
export type JsonSchema = Record<string, unknown>;

export interface Param {
  name: string;
  in: "path" | "query" | "header";
  required: boolean;
  schema: JsonSchema;
}

export interface Operation {
  /** `operationId`, or `METHOD path` when the document gives none. */
  id: string;
  method: string;
  /** The path template, `/v1/agents/{id}`. */
  path: string;
  params: Param[];
  /** The request body's media types and schemas (empty: the operation takes no body). */
  body: { mediaType: string; schema: JsonSchema }[];
  /** The statuses the document lists for the operation. */
  statuses: Set<number>;
  /** False when the document says the operation needs no credentials (`security: []`). */
  authenticated: boolean;
}

const methods = ["get", "put", "post", "delete", "patch", "head", "options"] as const;

/** Replaces every `{"$ref": "#/…"}` by what it names (a reference cycle is cut to `{}`). */
export function resolveRefs(node: unknown, root: unknown, seen: ReadonlySet<string> = new Set()): unknown {
  if (Array.isArray(node)) return node.map((n) => resolveRefs(n, root, seen));
  if (typeof node !== "object" || node === null) return node;
  const ref = (node as { $ref?: unknown }).$ref;
  if (typeof ref === "string" && ref.startsWith("#/")) {
    if (seen.has(ref)) return {};
    let target: unknown = root;
    for (const part of ref.slice(2).split("/")) target = (target as Record<string, unknown> | undefined)?.[part.replaceAll("~1", "/").replaceAll("~0", "~")];
    const { $ref: _ref, ...rest } = node as Record<string, unknown>;
    return resolveRefs({ ...(target as object), ...rest }, root, new Set([...seen, ref]));
  }
  return Object.fromEntries(Object.entries(node).map(([k, v]) => [k, resolveRefs(v, root, seen)]));
}

/** The operations of an OpenAPI 3.1 document. */
export function operationsOf(document: unknown): Operation[] {
  const doc = resolveRefs(document, document) as { paths?: Record<string, Record<string, unknown>>; security?: unknown[] };
  const out: Operation[] = [];
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of methods) {
      const op = item[method] as
        | {
            operationId?: string;
            parameters?: Param[];
            requestBody?: { content?: Record<string, { schema?: JsonSchema }> };
            responses?: Record<string, unknown>;
            security?: unknown[];
          }
        | undefined;
      if (!op) continue;
      const params = [...((item.parameters as Param[] | undefined) ?? []), ...(op.parameters ?? [])].map((p) => ({
        ...p,
        required: p.required === true,
        schema: p.schema ?? {},
      }));
      const body = Object.entries(op.requestBody?.content ?? {}).map(([mediaType, c]) => ({ mediaType, schema: c.schema ?? {} }));
      const statuses = new Set(
        Object.keys(op.responses ?? {})
          .map(Number)
          .filter(Number.isInteger),
      );
      const security = op.security ?? doc.security ?? [];
      out.push({
        id: op.operationId ?? `${method.toUpperCase()} ${path}`,
        method: method.toUpperCase(),
        path,
        params,
        body,
        statuses,
        authenticated: security.length > 0,
      });
    }
  }
  return out;
}

/** The gateway's document, as `GET /openapi.json` serves it: routes added since the last `npm run openapi` are in it too. */
export async function fetchOperations(baseUrl: string): Promise<Operation[]> {
  const res = await fetch(`${baseUrl}/openapi.json`);
  if (res.status !== 200) throw new Error(`GET /openapi.json answered ${res.status}`);
  return operationsOf(await res.json());
}
