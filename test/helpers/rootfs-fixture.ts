// A tiny built image for tests, made without the image builder: static busybox with its applet links, shell CGI
// scripts served by `busybox httpd`, turned into an ext4 labelled `agentvm-image` with `mke2fs -d`, and its artifact.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { ImageArtifact, ImageConfig } from "../../contracts/image.ts";
import { mke2fsBinary } from "../../fleet-agent/drivers/common/agent-disk.ts";

export const BUSYBOX = "/bin/busybox";

/** The uid/gid the fixture's agent runs as (its /data belongs to it). */
export const FIXTURE_UID = 1000;
export const FIXTURE_GID = 1000;

/**
 * CGI scripts under /www/cgi-bin (QUERY_STRING is the argument where one is taken):
 * env (AGENT_ID, PORT, LEASE_DIR, ids, cwd), disk-write/disk-read (/data/note.txt on the agent's disk),
 * tmp-write/tmp-read (/tmp/note.txt: memory), fill (dd 100 MB into /data/big; dd's words and status),
 * unfill, df, lease (a keep-awake lease file for 60 s), crash (ends the entrypoint); and ready (503 until /tmp/ready exists).
 */
const CGI: Record<string, string> = {
  env: `echo "agent=$AGENT_ID port=$PORT lease=$LEASE_DIR uid=$(id -u) gid=$(id -g) cwd=$(pwd) path=$PATH home=$HOME"`,
  "disk-write": `printf '%s' "$QUERY_STRING" > /data/note.txt && echo written`,
  "disk-read": `cat /data/note.txt 2>&1`,
  "tmp-write": `printf '%s' "$QUERY_STRING" > /tmp/note.txt && echo written`,
  "tmp-read": `cat /tmp/note.txt 2>&1`,
  fill: `dd if=/dev/zero of=/data/big bs=1M count=100 2>&1; echo "dd-status=$?"`,
  unfill: `rm -f /data/big && sync && echo removed`,
  df: `df -k /data 2>&1`,
  lease: `echo $(( $(date +%s) + 60 )) > "$LEASE_DIR/cgi" && echo leased`,
  crash: `echo "crashing on request"; killall httpd`,
};

/** Answers 503 until /tmp/ready exists, then 200; says each answer on stderr (the console). Raw: httpd passes an "HTTP/" reply through. */
const READY_CGI = `#!/bin/sh
if [ -e /tmp/ready ]; then
  echo "ready-probe: ready" >&2
  printf 'HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\nContent-Length: 6\\r\\n\\r\\nready\\n'
else
  echo "ready-probe: not yet" >&2
  printf 'HTTP/1.1 503 Service Unavailable\\r\\nContent-Type: text/plain\\r\\nContent-Length: 9\\r\\n\\r\\nnot yet\\r\\n'
fi
`;

export interface RootfsFixture {
  artifact: ImageArtifact;
  /** The directory the ext4 was made from (tests may read it). */
  dir: string;
  remove(): void;
}

/** The fixture's config: `busybox httpd` on `port`, as uid 1000, started through a shell that says so on stdout. */
export function fixtureConfig(overrides: Partial<ImageConfig> = {}): ImageConfig {
  return {
    entrypoint: ["/bin/sh", "-c"],
    cmd: ['echo "workload-started port=$PORT agent=$AGENT_ID"; exec httpd -f -vv -p "$PORT" -h /www'],
    env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello from the image"],
    workdir: "/www",
    user: `${FIXTURE_UID}:${FIXTURE_GID}`,
    uid: FIXTURE_UID,
    gid: FIXTURE_GID,
    port: 8081,
    ...overrides,
  };
}

/** Builds the rootfs and its ext4 (`sizeMiB`) in a fresh temp directory. */
export function makeRootfsFixture(opts: { config?: ImageConfig; sizeMiB?: number } = {}): RootfsFixture {
  const work = mkdtempSync(join(tmpdir(), "rootfs-fixture-"));
  const dir = join(work, "root");
  for (const d of ["bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "tmp", "run", "www/cgi-bin", "data"])
    mkdirSync(join(dir, d), { recursive: true });
  chmodSync(join(dir, "tmp"), 0o1777);
  writeFileSync(join(dir, "bin/busybox"), readFileSync(BUSYBOX), { mode: 0o755 });
  const applets = execFileSync(BUSYBOX, ["--list-full"], { encoding: "utf8" }).split("\n").filter(Boolean);
  for (const applet of applets) {
    if (applet === "bin/busybox") continue;
    mkdirSync(join(dir, dirname(applet)), { recursive: true });
    symlinkSync("/bin/busybox", join(dir, applet));
  }
  writeFileSync(join(dir, "etc/passwd"), `root:x:0:0:root:/root:/bin/sh\nagent:x:${FIXTURE_UID}:${FIXTURE_GID}:agent:/data:/bin/sh\n`);
  writeFileSync(join(dir, "etc/group"), `root:x:0:\nagent:x:${FIXTURE_GID}:\n`);
  writeFileSync(join(dir, "www/index.html"), "fixture\n");
  for (const [name, body] of Object.entries(CGI)) {
    writeFileSync(join(dir, "www/cgi-bin", name), `#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\n${body}\n`, { mode: 0o755 });
  }
  writeFileSync(join(dir, "www/cgi-bin/ready"), READY_CGI, { mode: 0o755 });
  chownSync(join(dir, "data"), FIXTURE_UID, FIXTURE_GID);
  const rootfs = join(work, "rootfs.ext4");
  execFileSync(mke2fsBinary(), ["-t", "ext4", "-q", "-F", "-O", "^has_journal", "-L", "agentvm-image", "-d", dir, rootfs, `${opts.sizeMiB ?? 24}M`], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  const digest = `sha256:${createHash("sha256").update(readFileSync(rootfs)).digest("hex")}`;
  return {
    artifact: { digest, rootfs, sizeBytes: statSync(rootfs).size, config: opts.config ?? fixtureConfig() },
    dir,
    remove: () => rmSync(work, { recursive: true, force: true }),
  };
}
