// Builds the dashboard (dashboard/ → dist/dashboard/: index.html, one minified JS, one CSS) unless the stamp of its
// sources' hash says the last build is current: `npm run dashboard:build` runs it, `npm start` calls `ensureDashboard`.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { takeLock } from "../lib/node-lock.ts";

const root = fileURLToPath(new URL("..", import.meta.url));
export const dashboardSourceDir = join(root, "dashboard");
/** Where the gateway serves the dashboard from (gateway/node/dashboard.ts reads the same directory). */
export const dashboardOutDir = join(root, "dist", "dashboard");
const stampName = ".build-stamp.json";
/** The bundle's files (`app-`, `style-`, and `vnc-`: the desktop viewer's noVNC, loaded by that page only), named by their content: the build removes older ones. */
const bundleFile = /^[a-z]+-[A-Z0-9]+\.(js|css)$/;

interface Stamp {
  hash: string;
  files: string[];
}

function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...filesUnder(path));
    else out.push(path);
  }
  return out.sort();
}

function readOr(path: string, fallback: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return fallback;
  }
}

/** The hash of what the bundle is made of: the dashboard's files, this script, and the esbuild, preact and noVNC that build it. */
export function dashboardSourceHash(): string {
  const h = createHash("sha256");
  for (const file of filesUnder(dashboardSourceDir)) {
    h.update(`${relative(dashboardSourceDir, file)}\0`);
    h.update(readFileSync(file));
    h.update("\0");
  }
  h.update(readFileSync(fileURLToPath(import.meta.url)));
  for (const pkg of ["esbuild", "preact", "@novnc/novnc"])
    h.update(`${pkg}@${(JSON.parse(readOr(join(root, "node_modules", pkg, "package.json"), "{}")) as { version?: string }).version ?? "?"}\0`);
  return h.digest("hex");
}

function readStamp(outDir: string): Stamp | undefined {
  try {
    const stamp = JSON.parse(readFileSync(join(outDir, stampName), "utf8")) as Stamp;
    return typeof stamp.hash === "string" && Array.isArray(stamp.files) ? stamp : undefined;
  } catch {
    return undefined;
  }
}

function current(outDir: string, hash: string): boolean {
  const stamp = readStamp(outDir);
  return stamp !== undefined && stamp.hash === hash && stamp.files.every((f) => existsSync(join(outDir, f)));
}

/** Writes a file whole or not at all (a gateway serving the directory never reads half of one). */
function writeAtomically(path: string, data: string | Uint8Array): void {
  const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.tmp`);
  writeFileSync(tmp, data);
  renameSync(tmp, path);
}

async function bundle(outDir: string): Promise<string[]> {
  // Imported here: a prebuilt dist/dashboard starts without esbuild (a devDependency) installed.
  const { build } = await import("esbuild");
  const result = await build({
    entryPoints: { app: join(dashboardSourceDir, "main.tsx"), style: join(dashboardSourceDir, "style.css") },
    outdir: outDir,
    entryNames: "[name]-[hash]",
    chunkNames: "chunk-[hash]",
    bundle: true,
    // The viewer's noVNC is a chunk of its own, loaded when a desktop is opened (import() in DesktopViewer.tsx).
    splitting: true,
    minify: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    jsx: "automatic",
    jsxImportSource: "preact",
    legalComments: "none",
    write: false,
    logLevel: "silent",
  });
  mkdirSync(outDir, { recursive: true });
  const names: string[] = [];
  // The bundle's files are named by their content: written before the index.html that names them.
  for (const file of result.outputFiles) {
    writeAtomically(file.path, file.contents);
    names.push(basename(file.path));
  }
  const script = names.find((n) => n.startsWith("app-") && n.endsWith(".js"));
  const style = names.find((n) => n.startsWith("style-") && n.endsWith(".css"));
  if (!script || !style) throw new Error(`dashboard build: expected app-*.js and style-*.css, got ${names.join(", ")}`);
  const html = readFileSync(join(dashboardSourceDir, "index.html"), "utf8")
    .replace("%SCRIPT%", `/dashboard/${script}`)
    .replace("%STYLE%", `/dashboard/${style}`);
  writeAtomically(join(outDir, "index.html"), html);
  for (const old of readdirSync(outDir)) if (bundleFile.test(old) && !names.includes(old)) rmSync(join(outDir, old), { force: true });
  return ["index.html", ...names];
}

export interface EnsureDashboardOptions {
  /** Default dist/dashboard (what the gateway serves). */
  outDir?: string;
  /** Build even when the stamp matches. */
  force?: boolean;
  log?: (line: string) => void;
}

/** Builds the dashboard when its sources changed since the last build (one build at a time across processes); answers its directory. */
export async function ensureDashboard(opts: EnsureDashboardOptions = {}): Promise<string> {
  const outDir = opts.outDir ?? dashboardOutDir;
  const hash = dashboardSourceHash();
  if (!opts.force && current(outDir, hash)) return outDir;
  mkdirSync(dirname(outDir), { recursive: true });
  const release = await takeLock(`${outDir}.lock`);
  try {
    if (!opts.force && current(outDir, hash)) return outDir; // another process built it while we waited
    const started = performance.now();
    const files = await bundle(outDir);
    writeAtomically(join(outDir, stampName), JSON.stringify({ hash, files } satisfies Stamp));
    opts.log?.(`dashboard built in ${Math.round(performance.now() - started)} ms: ${outDir}`);
    return outDir;
  } finally {
    release();
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const dir = await ensureDashboard({ force: process.argv.includes("--force"), log: (line) => console.log(line) });
  console.log(`dashboard: ${dir}`);
}
