// The image API over real Postgres with a scripted builder: registration after a build, tags, tenants, deletes, agents pinned by digest.
import type { Scope } from "../../contracts/caller.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generateKeyPair, exportJWK, type JWK } from "jose";
import { silentLogger } from "../../lib/log.ts";
import { AppError } from "../../lib/errors.ts";
import { newId } from "../../lib/ids.ts";
import { createGateway } from "../../gateway/app.ts";
import { createAgentRepo } from "../../gateway/agents/repo.ts";
import { createJwtAuthenticator } from "../../gateway/auth.ts";
import type { AgentSpec } from "../../contracts/agent.ts";
import type { ImageArtifact } from "../../contracts/image.ts";
import { fromPrivateJwk, mintToken } from "../../compose/dev-keys.ts";
import { createDbAuditLog } from "../../schema/audit-log.ts";
import { createImageRepo } from "../../images/repo.ts";
import { createImageRoutes } from "../../images/routes.ts";
import { BuildRecord, type BuildUpload, type ImageBuilder } from "../../images/builds.ts";
import { freshDatabase } from "../helpers/db.ts";
import { fakeFleet } from "../helpers/fake-fleet.ts";
import type { Database } from "../../schema/db.ts";

let database: Database;
let privateJwk: JWK;
let app: ReturnType<typeof createGateway>;
const woken: AgentSpec[] = [];

const fleet = fakeFleet({
  async wake(agent: AgentSpec) {
    woken.push(agent);
    return { wake: "boot", runId: "run_x", timings: { bootMs: 1 } };
  },
});

/** Reads the upload like the real builder; the first bytes say how the build ends. */
class ScriptedBuilder implements ImageBuilder {
  readonly builds = new Map<string, BuildRecord>();
  readonly removed: string[] = [];
  start(upload: BuildUpload): BuildRecord {
    const record = new BuildRecord(newId("build"), upload.tenantId, upload.kind, new Date());
    this.builds.set(record.id, record);
    void (async () => {
      const text = await new Response(upload.body).text();
      record.emit({ type: "step", step: 1, total: 2, text: "FROM scratch" });
      await new Promise((r) => setTimeout(r, 20));
      record.emit({ type: "log", line: `got ${text.length} bytes` });
      if (text.startsWith("bad")) return record.fail(new AppError("build_failed", "STEP 2/2: RUN false: exit status 1"), new Date());
      if (text.startsWith("corrupt")) return record.fail(new AppError("bad_archive", "not an OCI archive or docker save tarball"), new Date());
      const digest = `sha256:${Buffer.from(text.padEnd(32, "x").slice(0, 32)).toString("hex")}`;
      const artifact: ImageArtifact = {
        digest,
        rootfs: `/nowhere/${digest}`,
        sizeBytes: 1234,
        config: { entrypoint: [], cmd: ["node", "/app/server.js"], env: ["PATH=/usr/bin"], workdir: "/app", user: "", uid: 0, gid: 0, port: 8080 },
      };
      record.emit({ type: "step", step: 2, total: 2, text: "COPY . /app" });
      record.succeed(artifact, new Date());
    })();
    return record;
  }
  get(id: string) {
    return this.builds.get(id);
  }
  async removeFiles(digest: string) {
    this.removed.push(digest);
  }
}
const builder = new ScriptedBuilder();

beforeAll(async () => {
  database = await freshDatabase();
  const { privateKey } = await generateKeyPair("ES256", { extractable: true });
  privateJwk = { ...(await exportJWK(privateKey)), kid: "k1" };
  const repo = createAgentRepo(database.db);
  await repo.ensureTenant("ten_a", "A");
  await repo.ensureTenant("ten_b", "B");
  const audit = createDbAuditLog(database.db);
  const imageRepo = createImageRepo(database.db);
  app = createGateway({
    agents: repo,
    fleet,
    audit,
    auth: createJwtAuthenticator({ keys: { jwks: fromPrivateJwk(privateJwk).jwks }, issuer: "agentvm-dev", audience: "agentvm", algorithms: ["ES256"] }),
    log: silentLogger,
    config: {
      domain: undefined,
      maxBodyBytes: 1000,
      maxApiBodyBytes: 10_000,
      images: ["demo"],
      agentDefaults: { vcpus: 1, memMiB: 256, idleTimeoutMs: 1000, streamIdleMs: 1000, diskMiB: 512 },
    },
    routes: [createImageRoutes({ repo: imageRepo, builder, audit, log: silentLogger, maxUploadBytes: 1000 })],
    imageCatalog: imageRepo,
  });
});
afterAll(async () => database?.close());

const auth = async (tenant = "ten_a") => ({
  authorization: `Bearer ${await mintToken(privateJwk, { tenant, scopes: ["agents:invoke", "agents:admin", "images:read", "images:write"] })}`,
});

async function upload(query: string, body: string, headers: Record<string, string> = {}) {
  return app.request(`/v1/images?${query}`, { method: "POST", body, headers: { ...(await auth()), "content-type": "application/x-tar", ...headers } });
}

interface ImageJson {
  id: string;
  name: string;
  tag: string;
  digest: string;
  sizeBytes: number;
  config: { cmd: string[] };
}

describe("image API", () => {
  it("registers a built image under name:tag and lists it for its tenant only", async () => {
    const res = await upload("name=node-agent&tag=v1", "context-one");
    expect(res.status).toBe(201);
    const { image, build } = (await res.json()) as { image: ImageJson; build: { id: string; status: string } };
    expect(image).toMatchObject({ name: "node-agent", tag: "v1", sizeBytes: 1234, config: { cmd: ["node", "/app/server.js"] } });
    expect(image.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(build.status).toBe("succeeded");
    const mine = (await (await app.request("/v1/images", { headers: await auth() })).json()) as { images: ImageJson[] };
    expect(mine.images.map((i) => `${i.name}:${i.tag}`)).toContain("node-agent:v1");
    const theirs = (await (await app.request("/v1/images", { headers: await auth("ten_b") })).json()) as { images: ImageJson[] };
    expect(theirs.images).toEqual([]);
    expect((await app.request(`/v1/images/${image.id}`, { headers: await auth("ten_b") })).status).toBe(404);
    const log = await (await app.request(`/v1/images/builds/${build.id}/log`, { headers: await auth() })).text();
    expect(log).toContain("STEP 1/2: FROM scratch");
    expect(log).toContain("got 11 bytes");
  });

  it("images have scopes of their own: agents:admin alone neither builds nor lists; images:write without it builds", async () => {
    const as = async (scopes: Scope[]) => ({ authorization: `Bearer ${await mintToken(privateJwk, { tenant: "ten_a", scopes })}` });
    const adminOnly = await as(["agents:invoke", "agents:admin"]);
    const refused = await upload("name=scoped&tag=v1", "context-scoped", adminOnly);
    expect(refused.status).toBe(403);
    expect(((await refused.json()) as { error: { code: string; message: string } }).error).toMatchObject({
      code: "forbidden",
      message: expect.stringContaining("images:write"),
    });
    expect((await app.request("/v1/images", { headers: adminOnly })).status).toBe(403);
    const pipeline = await as(["images:write"]);
    const built = await upload("name=scoped&tag=v1", "context-scoped", pipeline);
    expect(built.status).toBe(201);
    const { image } = (await built.json()) as { image: ImageJson };
    expect((await app.request(`/v1/images/${image.id}`, { headers: pipeline })).status).toBe(403); // reading is images:read
    expect((await app.request(`/v1/images/${image.id}`, { headers: await as(["images:read"]) })).status).toBe(200);
    expect((await app.request(`/v1/images/${image.id}`, { method: "DELETE", headers: await as(["images:read"]) })).status).toBe(403);
  });

  it("a failed build answers 422 build_failed and registers nothing", async () => {
    const before = ((await (await app.request("/v1/images", { headers: await auth() })).json()) as { images: unknown[] }).images.length;
    const res = await upload("name=broken", "bad context");
    expect(res.status).toBe(422);
    const body = (await res.json()) as { error: { code: string; message: string; requestId: string } };
    expect(body.error.code).toBe("build_failed");
    expect(body.error.message).toContain("RUN false");
    expect(body.error.requestId).toMatch(/^req_/);
    const corrupt = await upload("name=broken&kind=archive", "corrupt bytes");
    expect(corrupt.status).toBe(400);
    expect(((await corrupt.json()) as { error: { code: string } }).error.code).toBe("bad_archive");
    const after = ((await (await app.request("/v1/images", { headers: await auth() })).json()) as { images: unknown[] }).images.length;
    expect(after).toBe(before);
  });

  it("rejects bad names, kinds, files and oversized uploads with clear 4xx", async () => {
    expect((await upload("name=Bad Name", "x")).status).toBe(400);
    expect((await upload("name=ok&tag=-x", "x")).status).toBe(400);
    expect((await upload("name=ok&kind=zip", "x")).status).toBe(400);
    expect((await upload("name=ok&file=../../etc/passwd", "x")).status).toBe(400);
    const big = await upload("name=ok", "y".repeat(2000), { "content-length": "2000" });
    expect(big.status).toBe(413);
    expect((await app.request("/v1/images?name=x", { method: "POST", body: "x" })).status).toBe(401);
  });

  it("streams a build's events as NDJSON ending with the image", async () => {
    const res = await upload("name=streamed", "context-two", { accept: "application/x-ndjson" });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toContain("application/x-ndjson");
    const lines = (await res.text())
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { type: string; image?: ImageJson });
    expect(lines[0]!.type).toBe("build");
    expect(lines.filter((l) => l.type === "step").length).toBe(2);
    expect(lines.at(-1)!.type).toBe("image");
    expect(lines.at(-1)!.image!.name).toBe("streamed");
    const failed = await upload("name=streamed-bad", "bad again", { accept: "application/x-ndjson" });
    const last = JSON.parse((await failed.text()).trim().split("\n").at(-1)!) as { type: string; error: { code: string } };
    expect(last).toMatchObject({ type: "error", error: { code: "build_failed" } });
  });

  it("an agent names an image by name:tag, name or digest and is pinned to the digest", async () => {
    const built = (await (await upload("name=pinned", "context-three")).json()) as { image: ImageJson };
    const create = async (image: string, extra: Record<string, unknown> = {}) =>
      app.request("/v1/agents", { method: "POST", body: JSON.stringify({ image, ...extra }), headers: await auth() });
    for (const ref of ["pinned:latest", "pinned", built.image.digest]) {
      const res = await create(ref);
      expect(res.status, ref).toBe(201);
      const agent = (await res.json()) as { id: string; image: string; imageDigest: string; diskMiB: number };
      expect(agent).toMatchObject({ image: "pinned:latest", imageDigest: built.image.digest, diskMiB: 512 });
    }
    const sized = (await (await create("pinned", { diskMiB: 2048 })).json()) as { id: string; diskMiB: number };
    expect(sized.diskMiB).toBe(2048);
    // The host is handed the digest, so a new build under the same tag does not change this agent.
    await app.request(`/v1/agents/${sized.id}/wake`, { method: "POST", headers: await auth() });
    expect(woken.at(-1)).toMatchObject({ id: sized.id, image: built.image.digest, diskMiB: 2048 });
    expect((await create("pinned:nope")).status).toBe(400);
    expect((await create("BAD IMAGE")).status).toBe(400);
    expect((await create("pinned", { diskMiB: 10 })).status).toBe(400);
    // Another tenant cannot use it, even by digest.
    const other = await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ image: built.image.digest }), headers: await auth("ten_b") });
    expect(other.status).toBe(400);
  });

  it("deleting an image in use is 409; once its agents are gone the row and the files go", async () => {
    const built = (await (await upload("name=used", "context-four")).json()) as { image: ImageJson };
    const agent = (await (await app.request("/v1/agents", { method: "POST", body: JSON.stringify({ image: "used" }), headers: await auth() })).json()) as {
      id: string;
    };
    const refused = await app.request(`/v1/images/${built.image.id}`, { method: "DELETE", headers: await auth() });
    expect(refused.status).toBe(409);
    expect(builder.removed).not.toContain(built.image.digest);
    expect((await app.request(`/v1/agents/${agent.id}`, { method: "DELETE", headers: await auth() })).status).toBe(200);
    const deleted = await app.request(`/v1/images/${built.image.id}`, { method: "DELETE", headers: await auth() });
    expect(deleted.status).toBe(200);
    expect(builder.removed).toContain(built.image.digest);
    expect((await app.request(`/v1/images/${built.image.id}`, { headers: await auth() })).status).toBe(404);
  });

  it("pages the list by name then tag with an opaque cursor: no duplicate, no gap; a bad cursor is 400", async () => {
    const repo = createImageRepo(database.db);
    const config = { entrypoint: [], cmd: ["x"], env: [], workdir: "/", user: "", uid: 0, gid: 0, port: 8080 };
    const refs = ["alpha:1", "alpha:2", "alpha:10", "beta:latest", "beta/sub:latest", "gamma:a", "gamma:b"];
    for (const ref of refs) {
      const [name, tag] = ref.split(":") as [string, string];
      await repo.put({
        id: newId("image"),
        tenantId: "ten_b",
        name,
        tag,
        digest: `sha256:${"c".repeat(64)}`,
        sizeBytes: 1,
        config,
        source: "archive",
        buildId: newId("build"),
      });
    }
    const seen: string[][] = [];
    let cursor: string | null = null;
    do {
      const res: Response = await app.request(`/v1/images?limit=3${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`, { headers: await auth("ten_b") });
      expect(res.status).toBe(200);
      const page = (await res.json()) as { images: ImageJson[]; nextCursor: string | null };
      seen.push(page.images.map((i) => `${i.name}:${i.tag}`));
      cursor = page.nextCursor;
    } while (cursor && seen.length < 10);
    expect(seen.map((p) => p.length)).toEqual([3, 3, 1]);
    expect(seen.flat()).toEqual(["alpha:1", "alpha:10", "alpha:2", "beta:latest", "beta/sub:latest", "gamma:a", "gamma:b"]);
    for (const q of ["cursor=nope!", "cursor=WzFd", "limit=0", "limit=1001", "page=2"]) {
      const res = await app.request(`/v1/images?${q}`, { headers: await auth("ten_b") });
      expect(res.status, q).toBe(400);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("bad_request");
    }
  });

  it("is described in /openapi.json: the upload's binary body, JSON or NDJSON answers, the paged list", async () => {
    const doc = (await (await app.request("/openapi.json")).json()) as {
      paths: Record<
        string,
        Record<
          string,
          {
            operationId: string;
            requestBody?: { content: Record<string, { schema: { format?: string } }> };
            responses: Record<string, { content?: Record<string, unknown> }>;
          }
        >
      >;
    };
    const upload = doc.paths["/v1/images"]!.post!;
    expect(upload.operationId).toBe("createImage");
    expect(upload.requestBody!.content["application/octet-stream"]!.schema.format).toBe("binary");
    expect(Object.keys(upload.responses["200"]!.content!)).toEqual(["application/x-ndjson"]);
    expect(upload.responses["413"]).toBeDefined();
    expect(doc.paths["/v1/images"]!.get!.operationId).toBe("listImages");
    expect(Object.keys(doc.paths["/v1/images/builds/{id}/log"]!.get!.responses["200"]!.content!)).toEqual(["text/plain"]);
  });

  it("retagging moves the tag; the old digest's files stay while another tag names them", async () => {
    const one = (await (await upload("name=moving&tag=a", "context-five")).json()) as { image: ImageJson };
    const two = (await (await upload("name=moving&tag=b", "context-five")).json()) as { image: ImageJson };
    expect(two.image.digest).toBe(one.image.digest);
    const moved = (await (await upload("name=moving&tag=a", "context-six")).json()) as { image: ImageJson };
    expect(moved.image.id).toBe(one.image.id);
    expect(moved.image.digest).not.toBe(one.image.digest);
    await app.request(`/v1/images/${two.image.id}`, { method: "DELETE", headers: await auth() });
    expect(builder.removed).toContain(two.image.digest);
  });
});
