// The firecracker driver's variables (one zod fragment) and the driver built from them, for the program's edge to call.
import { join, resolve } from "node:path";
import { z } from "zod";
import { envVar, parseEnv, readBool, vars, type Env } from "../../../lib/env.ts";
import { AppError } from "../../../lib/errors.ts";
import type { Logger } from "../../../lib/log.ts";
import { directEgressLists } from "../../egress/direct-lists.ts";
import type { EgressRules } from "../../egress/policy.ts";
import { FirecrackerDriver, type FirecrackerImage } from "./driver.ts";
import type { NetOptions } from "./net.ts";

export const NET_SETUP_SCRIPT = resolve(import.meta.dirname, "../../../scripts/setup-firecracker-net.sh");

export const firecrackerEnv = z.object({
  FIRECRACKER_BIN: vars.str({ type: "path", fallback: "firecracker", default: "`firecracker` on PATH", doc: "the firecracker binary" }),
  FIRECRACKER_NET_CIDR: vars.str({ type: "CIDR", fallback: "172.30.0.0/16", doc: "range cut into one /30 per VM (host `.1`, guest `.2`)" }),
  FIRECRACKER_UPLINK: vars.optStr({
    type: "interface",
    default: "(any non-tap interface)",
    doc: "the host interface egress leaves through, for agents that allow egress",
  }),
  FIRECRACKER_DIFF: envVar<boolean | "auto">(
    {
      type: "boolean or `auto`",
      default: "`auto`",
      doc: "diff snapshots after the first restore (a hibernation copies the last memory file and lets Firecracker write only the dirtied pages onto it); `auto`: where the data directory's filesystem makes that copy a reflink (probed and logged at start), else full snapshots",
    },
    (raw) => (raw === undefined || raw === "" || raw.toLowerCase() === "auto" ? "auto" : readBool(raw, false)),
  ),
  FIRECRACKER_VERIFY: vars.bool({ fallback: true, doc: "check the sha256 of snapshot files before loading them" }),
  FIRECRACKER_JAILER: vars.optStr({
    type: "path",
    default: "(unset: no jailer)",
    doc: "the jailer binary: every VM runs under it, as `FIRECRACKER_JAILER_UID`/`_GID` (required then)",
  }),
  FIRECRACKER_JAILER_UID: vars.optInt({ min: 0, default: "(required with `FIRECRACKER_JAILER`)", doc: "the uid firecracker runs as under the jailer" }),
  FIRECRACKER_JAILER_GID: vars.optInt({ min: 0, default: "(required with `FIRECRACKER_JAILER`)", doc: "the gid firecracker runs as under the jailer" }),
  FIRECRACKER_TEMPLATES: vars.bool({
    fallback: true,
    doc: "new agents start as clones of a warm template of their kind (`DATA_DIR/firecracker/templates`), built in the background on the first cold boot of each; a clone takes its template's network slot and a new template is built for the next",
  }),
});

export type FirecrackerSettings = z.output<typeof firecrackerEnv>;

/** FIRECRACKER_BIN alone (`npm run firecracker:check`). */
export function firecrackerBinary(env: Env): string {
  return parseEnv(firecrackerEnv.pick({ FIRECRACKER_BIN: true }), env).FIRECRACKER_BIN;
}

export function createFirecrackerDriver(opts: {
  /** The parsed variables (a program's edge); or `env`, parsed here (tests). */
  settings?: FirecrackerSettings;
  env?: Env;
  dataDir: string;
  /** Kernel (ELF vmlinux) and initramfs per image name, e.g. from ensureGuestImage. */
  images: (image: string) => Promise<FirecrackerImage>;
  logger?: Logger;
  /** Warm templates under `root` (FirecrackerDriverOptions.templates); none when absent (FIRECRACKER_TEMPLATES decides at the edge). */
  templates?: { root: string };
  /** The operator's EGRESS_ALLOW / EGRESS_DENY (egress/config.ts), enforced on the taps of agents with egress; none when absent. */
  egressRules?: EgressRules;
  /** Whether the data directory's filesystem makes reflinks (the edge probes it): `FIRECRACKER_DIFF=auto` follows it. Default false. */
  reflink?: boolean;
}): FirecrackerDriver {
  const v = opts.settings ?? parseEnv(firecrackerEnv, opts.env ?? {});
  const jailer = v.FIRECRACKER_JAILER;
  return new FirecrackerDriver({
    binary: v.FIRECRACKER_BIN,
    images: opts.images,
    network: firecrackerNetwork(v, opts),
    diffSnapshots: v.FIRECRACKER_DIFF === "auto" ? opts.reflink === true : v.FIRECRACKER_DIFF,
    verifyChecksums: v.FIRECRACKER_VERIFY,
    ...(jailer
      ? {
          jailer: {
            binary: jailer,
            uid: requiredId(v.FIRECRACKER_JAILER_UID, "FIRECRACKER_JAILER_UID"),
            gid: requiredId(v.FIRECRACKER_JAILER_GID, "FIRECRACKER_JAILER_GID"),
          },
        }
      : {}),
    ...(opts.logger ? { logger: opts.logger } : {}),
    ...(opts.templates ? { templates: opts.templates } : {}),
  });
}

/**
 * The driver's host networking: the taps' range, the setup script, the uplink, and the egress policy as the taps'
 * rules take it. What those rules cannot do that the proxy does is logged here, once per driver (at the program's
 * start), not per VM.
 */
export function firecrackerNetwork(v: FirecrackerSettings, opts: { dataDir: string; egressRules?: EgressRules; logger?: Logger }): NetOptions {
  const egress = directEgressLists(opts.egressRules ?? { allow: [], deny: [] });
  for (const note of egress.notes) opts.logger?.warn(note);
  const uplink = v.FIRECRACKER_UPLINK;
  return {
    slotsDir: join(opts.dataDir, "firecracker", "net-slots"),
    cidr: v.FIRECRACKER_NET_CIDR,
    setupScript: NET_SETUP_SCRIPT,
    ...(uplink ? { uplink } : {}),
    egress,
  };
}

function requiredId(id: number | undefined, name: string): number {
  if (id === undefined) throw new AppError("bad_request", `configuration: ${name} is required with FIRECRACKER_JAILER (the uid/gid firecracker runs as)`);
  return id;
}
