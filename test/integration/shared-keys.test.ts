// One key set for all gateways: gateways with their own data directories and one SIGNING_KEY_FILE accept the same tokens (`npm run token` mints with it); JWKS_FILE verifies with public keys only.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { ensureSigningKey, fromPrivateJwk, mintToken, devKeyPath } from "../../compose/dev-keys.ts";
import { readJwksFile } from "../../compose/node-gateway.ts";
import { mintDevToken } from "../../cli/token.ts";
import { AppError } from "../../lib/errors.ts";
import { tenants } from "../../schema/core.ts";
import { freshDatabase } from "../helpers/db.ts";
import { repoRoot, spawnNode, testComponentSecret, type Child } from "../helpers/worker-stack.ts";

let database: Awaited<ReturnType<typeof freshDatabase>>;
let root: string;
const children: Child[] = [];

beforeAll(async () => {
  database = await freshDatabase();
  root = mkdtempSync(join(tmpdir(), "agentvm-shared-keys-"));
  await database.db.insert(tenants).values({ id: "ten_shared", name: "shared" });
});

afterAll(async () => {
  for (const c of children) await c.stop();
  await database?.close();
  rmSync(root, { recursive: true, force: true });
});

function startGateway(name: string, env: Record<string, string>) {
  return spawnNode(
    "scripts/gateway.ts",
    {
      DATABASE_URL: database.url,
      COMPONENT_SECRET: testComponentSecret,
      DATA_DIR: join(root, name),
      PORT: "0",
      AGENT_IMAGES: "demo",
      LOG_LEVEL: "error",
      ...env,
    },
    /gateway listening at (http:\/\/\S+)/,
  ).then((c) => {
    children.push(c);
    return c.match[1]!;
  });
}

const listAgents = (url: string, token: string) => fetch(`${url}/v1/agents`, { headers: { authorization: `Bearer ${token}` } });

describe("one signing key file for several gateways", () => {
  it("concurrent first starts on one key file agree on one key (0600)", async () => {
    const path = join(root, "race", "signing-key.json");
    const loaded = await Promise.all([1, 2, 3, 4].map(() => ensureSigningKey(path)));
    const kids = new Set(loaded.map((k) => k.privateJwk.kid));
    expect(kids.size).toBe(1);
    expect(JSON.parse(readFileSync(path, "utf8")).kid).toBe([...kids][0]);
    expect(statSync(path).mode & 0o777).toBe(0o600);
    writeFileSync(join(root, "race", "not-a-key.json"), '{"kty":"oct","k":"abc"}');
    const err = await ensureSigningKey(join(root, "race", "not-a-key.json")).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).message).toMatch(/is no private ES256 key/);
  });

  it("two gateways with different DATA_DIRs and one SIGNING_KEY_FILE (made by their first start) accept a token of `npm run token`; JWKS_FILE accepts its key's tokens and refuses another's", async () => {
    const keyFile = join(root, "shared", "signing-key.json");
    // Both start at once on a key file that does not exist yet.
    const [one, two] = await Promise.all([startGateway("gw1", { SIGNING_KEY_FILE: keyFile }), startGateway("gw2", { SIGNING_KEY_FILE: keyFile })]);
    const { stdout } = await promisify(execFile)(process.execPath, [join(repoRoot, "scripts/token.ts"), "--tenant", "ten_shared", "--scopes", "agents:admin"], {
      cwd: repoRoot,
      env: { ...process.env, SIGNING_KEY_FILE: keyFile, DATA_DIR: join(root, "token-cli") },
    });
    const token = stdout.trim();
    for (const url of [one, two]) expect((await listAgents(url, token)).status).toBe(200);
    // The CLI's --key-file mints with the same key; the gateways' own data directories got no dev key of their own.
    const viaOption = await mintDevToken(
      {
        tenant: "ten_shared",
        scopes: "agents:admin",
        ttl: "10m",
        subject: "t",
        dataDir: join(root, "elsewhere"),
        keyFile,
        issuer: "agentvm-dev",
        audience: "agentvm",
      },
      () => {},
    );
    for (const url of [one, two]) expect((await listAgents(url, viaOption)).status).toBe(200);
    expect(() => statSync(devKeyPath(join(root, "gw1")))).toThrow();

    // A key of another file: refused by both.
    const stranger = await ensureSigningKey(join(root, "stranger", "key.json"));
    const strangerToken = await mintToken(stranger.privateJwk, { tenant: "ten_shared", scopes: ["agents:admin"] });
    for (const url of [one, two]) expect((await listAgents(url, strangerToken)).status).toBe(401);

    // A gateway that only verifies: the public half of the shared key in JWKS_FILE.
    const shared = fromPrivateJwk(JSON.parse(readFileSync(keyFile, "utf8")));
    const jwksFile = join(root, "jwks.json");
    writeFileSync(jwksFile, JSON.stringify(shared.jwks));
    expect(readJwksFile(jwksFile).keys[0]!.d).toBeUndefined();
    const verifier = await startGateway("gw3", { JWKS_FILE: jwksFile });
    expect((await listAgents(verifier, token)).status).toBe(200);
    const refused = await listAgents(verifier, strangerToken);
    expect(refused.status).toBe(401);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("unauthorized");
  }, 120_000);

  it("JWKS_FILE must hold public keys of a JWKS document", async () => {
    const privateDoc = join(root, "private-jwks.json");
    const k = await ensureSigningKey(join(root, "p", "key.json"));
    writeFileSync(privateDoc, JSON.stringify({ keys: [k.privateJwk] }));
    expect(() => readJwksFile(privateDoc)).toThrow(/holds a private key/);
    const notJwks = join(root, "empty-jwks.json");
    writeFileSync(notJwks, JSON.stringify({ keys: [] }));
    expect(() => readJwksFile(notJwks)).toThrow(/must be a JWKS document/);
    // A gateway given such a file does not start (the message says why).
    const err = await startGateway("gw4", { JWKS_FILE: privateDoc }).catch((e: Error) => e.message);
    expect(err).toMatch(/exited \(1\) before it was ready[\s\S]*JWKS_FILE .* holds a private key/);
  }, 60_000);
});
