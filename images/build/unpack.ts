// Unpacks an OCI layout into a root filesystem with umoci and turns the image's OCI config into an `ImageConfig`.
import { lstatSync, readFileSync, readlinkSync } from "node:fs";
import { join, posix } from "node:path";
import { AppError } from "../../lib/errors.ts";
import { isDesktopSize } from "../../contracts/agent.ts";
import { defaultImagePort, type ImageConfig } from "../../contracts/image.ts";
import { run, tailText, type RunOptions } from "./run.ts";
import { requireTools } from "./tools.ts";

/** The parts of an OCI image config (application/vnd.oci.image.config.v1+json) we read. */
export interface OciImageConfig {
  config?: {
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
    Env?: string[] | null;
    WorkingDir?: string;
    User?: string;
    ExposedPorts?: Record<string, unknown> | null;
    Labels?: Record<string, string> | null;
  };
  rootfs?: { type?: string; diff_ids?: string[] };
}

interface Descriptor {
  mediaType?: string;
  digest: string;
  annotations?: Record<string, string>;
  platform?: { os?: string; architecture?: string };
}

const INDEX_TYPES = new Set(["application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"]);

function readBlob(layout: string, digest: string): Buffer {
  const m = /^sha256:([0-9a-f]{64})$/.exec(digest);
  if (!m) throw new AppError("bad_archive", `the image names a blob that is not a sha256 digest: ${digest}`);
  return readFileSync(join(layout, "blobs", "sha256", m[1]!));
}

/** The image config of reference `ref` in an OCI layout: index.json → (nested index →) manifest → config blob. */
export function readLayoutConfig(layout: string, ref: string): OciImageConfig {
  const index = JSON.parse(readFileSync(join(layout, "index.json"), "utf8")) as { manifests?: Descriptor[] };
  let manifests = index.manifests ?? [];
  let desc = manifests.find((d) => d.annotations?.["org.opencontainers.image.ref.name"] === ref) ?? (manifests.length === 1 ? manifests[0] : undefined);
  for (let depth = 0; desc && INDEX_TYPES.has(desc.mediaType ?? "") && depth < 4; depth++) {
    // A multi-platform index: the linux/amd64 entry (our guests are x86-64).
    manifests = (JSON.parse(readBlob(layout, desc.digest).toString("utf8")) as { manifests?: Descriptor[] }).manifests ?? [];
    desc = manifests.find((d) => d.platform?.os === "linux" && d.platform.architecture === "amd64") ?? manifests[0];
  }
  if (!desc) throw new AppError("bad_archive", `the image layout has no image named ${ref}`);
  const manifest = JSON.parse(readBlob(layout, desc.digest).toString("utf8")) as { config?: Descriptor };
  if (!manifest.config?.digest) throw new AppError("bad_archive", "the image manifest names no config");
  return JSON.parse(readBlob(layout, manifest.config.digest).toString("utf8")) as OciImageConfig;
}

/** `umoci unpack --image <layout>:<ref> <bundle>`: layers applied in order with their whiteouts; the root is `<bundle>/rootfs`. */
export async function unpackLayout(layout: string, ref: string, bundle: string, opts: RunOptions = {}): Promise<string> {
  const { umoci } = requireTools(["umoci"]);
  const r = await run(umoci, ["unpack", "--image", `${layout}:${ref}`, bundle], { ...opts, keepLines: 20, env: { ...process.env, LC_ALL: "C" } });
  if (r.code !== 0)
    throw new AppError(
      "bad_archive",
      `the image's layers could not be unpacked (umoci): ${tailText(r.tail, 6).replaceAll(layout, "<layout>").replaceAll(bundle, "<bundle>")}`,
    );
  return join(bundle, "rootfs");
}

const MAX_ACCOUNTS_FILE = 4 * 1024 * 1024;

/**
 * Reads `/etc/passwd` or `/etc/group` of an unpacked root the way the guest will see it: symlinks are followed
 * inside the root, never out of it, and only a regular file is read (an image may ship a symlink to the host's
 * files, or a device node, at that path). Answers undefined when there is none.
 */
export function readInRoot(root: string, path: string): string | undefined {
  let parts = path.split("/").filter(Boolean);
  let resolved: string[] = [];
  for (let hops = 0; parts.length > 0; ) {
    const part = parts.shift()!;
    if (part === ".") continue;
    if (part === "..") {
      resolved.pop();
      continue;
    }
    const full = join(root, ...resolved, part);
    let st;
    try {
      st = lstatSync(full);
    } catch {
      return undefined;
    }
    if (st.isSymbolicLink()) {
      if (++hops > 40) return undefined;
      const target = readlinkSync(full);
      if (target.startsWith("/")) resolved = [];
      parts = [...target.split("/").filter(Boolean), ...parts];
      continue;
    }
    resolved.push(part);
    if (parts.length === 0) return st.isFile() && st.size <= MAX_ACCOUNTS_FILE ? readFileSync(full, "utf8") : undefined;
    if (!st.isDirectory()) return undefined;
  }
  return undefined;
}

interface Account {
  name: string;
  id: number;
  /** passwd: the primary group. */
  gid?: number;
}

function parseAccounts(text: string | undefined, kind: "passwd" | "group"): Account[] {
  const out: Account[] = [];
  for (const line of (text ?? "").split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const f = line.split(":");
    const id = Number(f[2]);
    if (!f[0] || !Number.isInteger(id)) continue;
    out.push(kind === "passwd" ? { name: f[0], id, gid: Number(f[3]) } : { name: f[0], id });
  }
  return out;
}

const numeric = /^\d+$/;

/**
 * The uid and gid of the image's `User` (`name`, `uid`, `name:group`, `uid:gid`, …) from the root's own /etc/passwd
 * and /etc/group, as the container runtimes do: a user without a group takes its passwd entry's group (0 for a
 * numeric uid the passwd does not know). An unknown name is `build_failed`: the guest has no way to look it up.
 */
export function resolveUser(root: string, user: string): { uid: number; gid: number } {
  if (user === "") return { uid: 0, gid: 0 };
  const [u = "", g] = user.split(":", 2);
  const passwd = parseAccounts(readInRoot(root, "/etc/passwd"), "passwd");
  let uid: number;
  let gid: number;
  if (numeric.test(u)) {
    uid = Number(u);
    gid = passwd.find((a) => a.id === uid)?.gid ?? 0;
  } else {
    const entry = passwd.find((a) => a.name === u);
    if (!entry)
      throw new AppError(
        "build_failed",
        `the image's USER ${user}: no user ${u} in the image's /etc/passwd (use a numeric uid:gid, or create the user in the image)`,
      );
    uid = entry.id;
    gid = entry.gid ?? 0;
  }
  if (g !== undefined && g !== "") {
    if (numeric.test(g)) gid = Number(g);
    else {
      const group = parseAccounts(readInRoot(root, "/etc/group"), "group").find((a) => a.name === g);
      if (!group) throw new AppError("build_failed", `the image's USER ${user}: no group ${g} in the image's /etc/group`);
      gid = group.id;
    }
  }
  if (uid > 0xfffffffe || gid > 0xfffffffe) throw new AppError("build_failed", `the image's USER ${user} is out of range`);
  return { uid, gid };
}

/** The one exposed TCP port; none: the default; several: the default when it is among them, else `build_failed`. */
export function imagePort(exposed: Record<string, unknown> | null | undefined): number {
  const tcp = new Set<number>();
  for (const key of Object.keys(exposed ?? {})) {
    const m = /^(\d+)(?:\/(tcp|udp|sctp))?$/i.exec(key);
    if (!m) throw new AppError("build_failed", `the image EXPOSEs ${key}, which is not a port`);
    if ((m[2] ?? "tcp").toLowerCase() !== "tcp") continue;
    const port = Number(m[1]);
    if (port < 1 || port > 65535) throw new AppError("build_failed", `the image EXPOSEs port ${port}, out of range`);
    tcp.add(port);
  }
  if (tcp.size === 0) return defaultImagePort;
  if (tcp.size === 1) return [...tcp][0]!;
  if (tcp.has(defaultImagePort)) return defaultImagePort;
  throw new AppError(
    "build_failed",
    `the image EXPOSEs several TCP ports (${[...tcp].sort((a, b) => a - b).join(", ")}): an agent serves on one; EXPOSE only that one (or ${defaultImagePort} among them)`,
  );
}

export const READY_PATH_LABEL = "agentvm.ready-path";
/** Set by the desktop base (images/build/base.ts): the image's entrypoint starts a desktop of this default size. */
export const DESKTOP_LABEL = "agentvm.desktop";

/** The `ImageConfig` of an unpacked image: what the guest needs to start it, resolved now. */
export function imageConfigOf(oci: OciImageConfig, root: string): ImageConfig {
  const c = oci.config ?? {};
  const entrypoint = c.Entrypoint ?? [];
  const cmd = c.Cmd ?? [];
  if (entrypoint.length === 0 && cmd.length === 0)
    throw new AppError(
      "build_failed",
      'the image has no ENTRYPOINT and no CMD: the agent would have nothing to run (add CMD ["node", "server.js"] or the like)',
    );
  const user = c.User ?? "";
  const { uid, gid } = resolveUser(root, user);
  const workdir = c.WorkingDir ? posix.resolve("/", c.WorkingDir) : "/";
  const config: ImageConfig = { entrypoint, cmd, env: c.Env ?? [], workdir, user, uid, gid, port: imagePort(c.ExposedPorts) };
  const readyPath = c.Labels?.[READY_PATH_LABEL];
  if (readyPath !== undefined) {
    if (!/^\/[\x21-\x7e]*$/.test(readyPath))
      throw new AppError("build_failed", `label ${READY_PATH_LABEL} must be a path starting with / (got ${JSON.stringify(readyPath)})`);
    config.readyPath = readyPath;
  }
  const desktop = c.Labels?.[DESKTOP_LABEL];
  if (desktop !== undefined) {
    const m = /^(\d{1,4})x(\d{1,4})$/.exec(desktop);
    const size = m ? { width: Number(m[1]), height: Number(m[2]) } : undefined;
    if (!isDesktopSize(size))
      throw new AppError(
        "build_failed",
        `label ${DESKTOP_LABEL} must be a display size WIDTHxHEIGHT within 320x200..3840x2160 (got ${JSON.stringify(desktop)})`,
      );
    config.desktop = size;
  }
  return config;
}
