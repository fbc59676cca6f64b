// Imports an uploaded image archive: tells an OCI archive from a `docker save` tarball and copies it to an OCI layout with skopeo.
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../../lib/errors.ts";
import { run, tailText, type RunOptions } from "./run.ts";
import { requireTools } from "./tools.ts";

export type ArchiveFormat = "oci-archive" | "docker-archive";

/**
 * The formats an archive can be read as, from the names at its root: `oci-layout` + `index.json` (OCI), `manifest.json`
 * (`docker save`). Docker 25 and later write both into one tarball; OCI is tried first there.
 */
export function archiveFormatsOf(names: string[]): ArchiveFormat[] {
  const root = new Set(names.map((n) => n.replace(/^(\.\/)+/, "").replace(/\/$/, "")));
  const out: ArchiveFormat[] = [];
  if (root.has("oci-layout") && root.has("index.json")) out.push("oci-archive");
  if (root.has("manifest.json")) out.push("docker-archive");
  return out;
}

/** Lists the archive's member names (GNU tar reads a compressed one too); a file that is not a whole tar is `bad_archive`. */
async function listArchive(file: string, opts: RunOptions): Promise<string[]> {
  const names: string[] = [];
  const r = await run("tar", ["-t", "-f", file], { ...opts, keepLines: 5, onLine: (l) => names.push(l) });
  if (r.code !== 0) {
    const why = r.tail
      .filter((l) => l.startsWith("tar: ") && !/Exiting with failure/.test(l))
      .map((l) => l.slice(5))
      .join("; ");
    throw new AppError(
      "bad_archive",
      `the upload is not a readable tar archive (${why || `tar exited with ${r.code}`}): send an OCI archive or a \`docker save\` tarball`,
    );
  }
  return names;
}

export interface ImportOptions {
  /** The uploaded archive file. */
  file: string;
  /** The OCI layout to create (must not exist). */
  layout: string;
  /** Reference given to the image in the layout. */
  ref: string;
  /** skopeo's scratch space (it unpacks an OCI archive there first). */
  tmpDir: string;
  onLine?: (line: string) => void;
  signal?: AbortSignal;
}

/**
 * Copies the one image of an OCI archive or `docker save` tarball into an OCI layout (`skopeo copy … oci:<layout>:<ref>`),
 * checking every blob's digest on the way. Answers the format it was read as. Anything but one readable image is `bad_archive` with skopeo's reason.
 */
export async function importArchive(opts: ImportOptions): Promise<ArchiveFormat> {
  const { skopeo } = requireTools(["skopeo"]);
  const base: RunOptions = { ...(opts.signal ? { signal: opts.signal } : {}) };
  const formats = archiveFormatsOf(await listArchive(opts.file, base));
  if (formats.length === 0)
    throw new AppError(
      "bad_archive",
      "the archive is neither an OCI archive (oci-layout and index.json at its root) nor a `docker save` tarball (manifest.json at its root)",
    );
  mkdirSync(opts.tmpDir, { recursive: true });
  const policy = join(opts.tmpDir, "policy.json");
  writeFileSync(policy, `${JSON.stringify({ default: [{ type: "insecureAcceptAnything" }] })}\n`);
  let failure: AppError | undefined;
  for (const format of formats) {
    // An OCI archive's uncompressed layers stay uncompressed (umoci reads them next; gzip would only cost time). Not a
    // docker save's: skopeo 1.9 keeps its layers' `tar.gzip` media type on the uncompressed bytes, which umoci refuses.
    const keep = format === "oci-archive" ? ["--dest-oci-accept-uncompressed-layers"] : [];
    const args = ["--policy", policy, "copy", "--quiet", ...keep, `${format}:${opts.file}`, `oci:${opts.layout}:${opts.ref}`];
    const r = await run(skopeo, args, {
      ...base,
      keepLines: 20,
      env: { ...process.env, LC_ALL: "C", TMPDIR: opts.tmpDir },
      ...(opts.onLine ? { onLine: opts.onLine } : {}),
    });
    if (r.code === 0) return format;
    rmSync(opts.layout, { recursive: true, force: true });
    const why = tailText(r.tail, 6).replaceAll(opts.file, "<archive>").replaceAll(opts.layout, "<layout>");
    const several = /more than one image|more than one manifest|multiple images/i.test(why);
    failure ??= new AppError(
      "bad_archive",
      several
        ? `the archive holds more than one image; send an archive of one image:\n${why}`
        : `the ${format === "oci-archive" ? "OCI archive" : "`docker save` tarball"} could not be read:\n${why}`,
    );
  }
  throw failure!;
}
