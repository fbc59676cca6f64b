// Firecracker's swagger (../shared/firecracker/firecracker.yaml) and a validator for the Swagger 2.0 subset it
// uses: $ref, type, required, properties, additionalProperties, enum, items, minimum, maximum.
// Objects that declare properties accept no others unless additionalProperties says so (Firecracker's
// request types refuse unknown fields).
import { existsSync, readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const FIRECRACKER_SPEC_PATH = resolve(repoRoot, "../shared/firecracker/firecracker.yaml");

/** Where the spec is read from: FIRECRACKER_SPEC when set (a test can point it at a missing file), else the shared folder. */
export function firecrackerSpecPath(): string {
  return process.env.FIRECRACKER_SPEC || FIRECRACKER_SPEC_PATH;
}

/**
 * For the test files that validate against the spec: why they cannot run here, or undefined when they can. A clone
 * without ../shared beside it skips them, and this prints one line saying why; under CI=true a missing spec is a
 * failure instead (it throws). Use as `describe.skipIf(firecrackerSpecMissing("<file>"))`.
 */
export function firecrackerSpecMissing(file: string): string | undefined {
  const path = firecrackerSpecPath();
  if (existsSync(path)) return undefined;
  if (process.env.CI === "true") throw new Error(`${file}: ${missingSpecMessage(path)} With CI=true a missing spec fails the run instead of skipping.`);
  const reason = `Firecracker API spec not found at ${path}${process.env.FIRECRACKER_SPEC ? " (FIRECRACKER_SPEC)" : " (../shared beside the repository)"}`;
  console.warn(`${file}: skipped: ${reason}`);
  return reason;
}

function missingSpecMessage(path: string): string {
  return (
    `Firecracker API spec not found at ${path}: the contract tests validate every request against it. ` +
    `It lives in the shared folder beside the repository (shared/firecracker/firecracker.yaml).`
  );
}

export interface Schema {
  $ref?: string;
  type?: string;
  required?: string[];
  properties?: Record<string, Schema>;
  additionalProperties?: boolean | Schema;
  enum?: unknown[];
  items?: Schema;
  minimum?: number;
  maximum?: number;
}

interface Parameter {
  in: string;
  name: string;
  required?: boolean;
  schema?: Schema;
}

interface Operation {
  operationId?: string;
  parameters?: Parameter[];
}

interface SwaggerDoc {
  swagger: string;
  info: { version: string };
  paths: Record<string, Record<string, Operation>>;
  definitions: Record<string, Schema>;
}

export interface ResolvedOperation {
  operationId: string;
  template: string;
  pathParams: Record<string, string>;
  body: { schema: Schema; required: boolean } | undefined;
}

export class FirecrackerSpec {
  readonly version: string;
  private readonly doc: SwaggerDoc;

  constructor(doc: SwaggerDoc) {
    if (doc.swagger !== "2.0" || !doc.paths || !doc.definitions) throw new Error("not a Swagger 2.0 document with paths and definitions");
    this.doc = doc;
    this.version = doc.info.version;
  }

  /** The operation for a concrete request path (`/drives/rootfs` matches `/drives/{drive_id}`). */
  operation(method: string, path: string): ResolvedOperation | undefined {
    const m = method.toLowerCase();
    for (const [template, ops] of Object.entries(this.doc.paths)) {
      const op = ops[m];
      if (!op) continue;
      const params = matchTemplate(template, path);
      if (!params) continue;
      const bodyParam = op.parameters?.find((p) => p.in === "body");
      return {
        operationId: op.operationId ?? `${m} ${template}`,
        template,
        pathParams: params,
        body: bodyParam?.schema ? { schema: bodyParam.schema, required: bodyParam.required === true } : undefined,
      };
    }
    return undefined;
  }

  /** Every way `body` breaks the schema of that operation's body parameter; [] when it conforms. */
  validateRequest(method: string, path: string, body: unknown): string[] {
    const op = this.operation(method, path);
    if (!op) return [`no operation ${method.toUpperCase()} ${path} in the spec`];
    if (!op.body) return body === undefined ? [] : [`${op.operationId} takes no body`];
    if (body === undefined) return op.body.required ? [`${op.operationId}: body is required`] : [];
    return this.validate(op.body.schema, body, "body");
  }

  validate(schema: Schema, value: unknown, where: string): string[] {
    const s = this.deref(schema);
    const errors: string[] = [];
    if (s.type && !typeMatches(s.type, value)) return [`${where}: expected ${s.type}, got ${describe(value)}`];
    if (s.enum && !s.enum.includes(value)) errors.push(`${where}: ${JSON.stringify(value)} is not one of ${s.enum.map((e) => JSON.stringify(e)).join(", ")}`);
    if (typeof value === "number") {
      if (s.minimum !== undefined && value < s.minimum) errors.push(`${where}: ${value} is below the minimum ${s.minimum}`);
      if (s.maximum !== undefined && value > s.maximum) errors.push(`${where}: ${value} is above the maximum ${s.maximum}`);
    }
    if (Array.isArray(value) && s.items) value.forEach((item, i) => errors.push(...this.validate(s.items!, item, `${where}[${i}]`)));
    if (isObject(value) && (s.type === "object" || s.properties || s.required)) {
      for (const name of s.required ?? []) if (!(name in value)) errors.push(`${where}: missing required property "${name}"`);
      for (const [name, v] of Object.entries(value)) {
        const prop = s.properties?.[name];
        if (prop) errors.push(...this.validate(prop, v, `${where}.${name}`));
        else if (s.additionalProperties === true) continue;
        else if (isObject(s.additionalProperties)) errors.push(...this.validate(s.additionalProperties, v, `${where}.${name}`));
        else if (s.additionalProperties === false || s.properties) errors.push(`${where}: unknown property "${name}"`);
      }
    }
    return errors;
  }

  definition(name: string): Schema {
    const d = this.doc.definitions[name];
    if (!d) throw new Error(`no definition ${name} in the spec`);
    return d;
  }

  private deref(schema: Schema): Schema {
    let s = schema;
    for (let hops = 0; s.$ref; hops++) {
      if (hops > 20) throw new Error(`$ref loop at ${schema.$ref}`);
      const m = /^#\/definitions\/(.+)$/.exec(s.$ref);
      if (!m) throw new Error(`unsupported $ref ${s.$ref}`);
      s = this.definition(m[1]!);
    }
    return s;
  }
}

/** Reads the spec; a missing file is a clear error (whether tests then skip is `firecrackerSpecMissing`'s call). */
export function loadFirecrackerSpec(path = firecrackerSpecPath()): FirecrackerSpec {
  if (!existsSync(path)) throw new Error(missingSpecMessage(path));
  return new FirecrackerSpec(parse(readFileSync(path, "utf8")) as SwaggerDoc);
}

function matchTemplate(template: string, path: string): Record<string, string> | undefined {
  const t = template.split("/");
  const p = path.split("?")[0]!.split("/");
  if (t.length !== p.length) return undefined;
  const params: Record<string, string> = {};
  for (let i = 0; i < t.length; i++) {
    const seg = t[i]!;
    const m = /^\{(.+)\}$/.exec(seg);
    if (m) {
      if (!p[i]) return undefined;
      params[m[1]!] = decodeURIComponent(p[i]!);
    } else if (seg !== p[i]) return undefined;
  }
  return params;
}

function typeMatches(type: string, value: unknown): boolean {
  switch (type) {
    case "object":
      return isObject(value);
    case "array":
      return Array.isArray(value);
    case "string":
      return typeof value === "string";
    case "boolean":
      return typeof value === "boolean";
    case "integer":
      return typeof value === "number" && Number.isInteger(value);
    case "number":
      return typeof value === "number" && Number.isFinite(value);
    default:
      throw new Error(`unsupported schema type ${type}`);
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  return `${typeof v} ${JSON.stringify(v)?.slice(0, 40)}`;
}
