// Serves the built dashboard (dist/dashboard, scripts/build-dashboard.ts) at /dashboard/: its files with their content
// types, index.html for the client-side routes and for a desktop agent's viewer at `/v1/agents/{id}/desktop`, `/`
// redirecting there. No tenant auth: the page holds nothing of a tenant's; its API calls and sockets carry the token.
import { readFile } from "node:fs/promises";
import { extname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { type Context, Hono } from "hono";
import type { GatewayEnv } from "../../contracts/caller.ts";
import { AppError } from "../../lib/errors.ts";

/** Where the build writes the dashboard, relative to this file's checkout. */
export const defaultDashboardDir = fileURLToPath(new URL("../../dist/dashboard/", import.meta.url));

export const dashboardPath = "/dashboard/";

const contentTypes: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".json": "application/json",
  ".txt": "text/plain; charset=utf-8",
  ".woff2": "font/woff2",
};

/** The page may load only its own files and call only this origin (the token in sessionStorage is worth protecting). */
const contentSecurityPolicy =
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/** The file a path under /dashboard/ names, inside `dir`; undefined for anything that would leave it or is hidden. */
export function dashboardFile(dir: string, rest: string): string | undefined {
  let decoded: string;
  try {
    decoded = decodeURIComponent(rest);
  } catch {
    return undefined;
  }
  if (decoded.includes("\0") || decoded.split("/").some((part) => part.startsWith("."))) return undefined;
  const root = resolve(dir);
  const file = resolve(join(root, decoded));
  return file.startsWith(root + sep) ? file : undefined;
}

async function readOrUndefined(path: string): Promise<Uint8Array | undefined> {
  try {
    return await readFile(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "EISDIR" || code === "ENOTDIR") return undefined;
    throw err;
  }
}

/**
 * `GET /` → 302 /dashboard/; `GET /dashboard/<file>`: the built file (`.build-stamp.json` and other dot files are not
 * served); any other path without an extension under /dashboard/ is a client-side route: index.html. Files are read
 * on each request, so a rebuild shows at the next load; the bundle's names carry their hash and are cached for good.
 */
export function dashboardRoutes(dir: string = defaultDashboardDir): Hono<GatewayEnv> {
  const r = new Hono<GatewayEnv>();

  r.get("/", (c) => c.redirect(dashboardPath, 302));
  r.get("/dashboard", (c) => c.redirect(dashboardPath, 301));

  r.get("/dashboard/*", async (c) => {
    const rest = c.req.path.slice(dashboardPath.length);
    const asked = rest === "" ? undefined : dashboardFile(dir, rest);
    const ext = extname(rest);
    if (rest !== "" && asked === undefined) throw new AppError("not_found", "no such dashboard file");
    if (asked !== undefined && ext !== "") {
      const body = await readOrUndefined(asked);
      if (!body) throw new AppError("not_found", `no dashboard file ${rest.slice(0, 200)}`);
      const hashed = /-[A-Z0-9]{8,}\.(js|css)$/.test(rest);
      return c.body(body as Uint8Array<ArrayBuffer>, 200, {
        "content-type": contentTypes[ext] ?? "application/octet-stream",
        "cache-control": hashed ? "public, max-age=31536000, immutable" : "no-cache",
        "x-content-type-options": "nosniff",
      });
    }
    return page(c);
  });
  // The desktop viewer (dashboard/DesktopViewer.tsx) at the agent's own API path: the same page, whose client route
  // reads the agent's id from the address. Whether the agent exists, has a desktop and is the caller's is the
  // viewer's WebSocket's to answer, with the token.
  r.get("/v1/agents/:id/desktop", page);

  async function page(c: Context<GatewayEnv>): Promise<Response> {
    const index = await readOrUndefined(join(dir, "index.html"));
    if (!index) throw new AppError("not_found", "the dashboard is not built: run npm run dashboard:build (npm start builds it)");
    return c.body(index as Uint8Array<ArrayBuffer>, 200, {
      "content-type": contentTypes[".html"]!,
      "cache-control": "no-cache",
      "x-content-type-options": "nosniff",
      "content-security-policy": contentSecurityPolicy,
      "referrer-policy": "no-referrer",
    });
  }

  return r;
}
