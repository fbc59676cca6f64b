// The shared artifact store's variables (one zod fragment): where it is, the host's caches of it, its garbage collector.
import { z } from "zod";
import { vars } from "../../lib/env.ts";

export const artifactStoreEnv = z.object({
  ARTIFACT_STORE_DIR: vars.optStr({
    type: "path",
    default: "(unset: snapshots and images stay on their host)",
    doc: "a directory every host and gateway mounts (NFS, EFS, CephFS): each hibernation is committed there as content-addressed blobs, and an agent that moves to another host (failover, drain) starts from its last commit; built images go there too, and a host fetches an image it lacks from it",
  }),
  ARTIFACT_CACHE_DIR: vars.optStr({ type: "path", default: "`DATA_DIR/artifact-cache`", doc: "this host's verified copies of blobs it read from the store" }),
  ARTIFACT_GC_INTERVAL_MS: vars.int({
    fallback: 3_600_000,
    min: 0,
    unit: "ms",
    doc: "with a store: how often each host removes the store's blobs that no live agent's commit, image or kept upstream body references (`0`: never)",
  }),
  ARTIFACT_GC_GRACE_MS: vars.int({
    fallback: 3_600_000,
    min: 60_000,
    unit: "ms",
    doc: "a blob put (or put again) this recently is never removed, referenced or not: its row may still be on the way",
  }),
  IMAGE_CACHE_MAX_MIB: vars.int({
    fallback: 20_480,
    min: 64,
    unit: "MiB",
    doc: "with a store: the images a host keeps under its data directory; past this the least recently used ones that are in the store and that no awake VM runs are removed (fetched again on their next use)",
  }),
});

export interface ArtifactStoreConfig {
  /** No `storeDir`: snapshots and images stay on their host. */
  storeDir: string | undefined;
  cacheDir: string | undefined;
  /** 0: no garbage collection. */
  gcIntervalMs: number;
  gcGraceMs: number;
  imageCacheMaxBytes: number;
}

export function artifactStoreConfigOf(v: z.output<typeof artifactStoreEnv>): ArtifactStoreConfig {
  return {
    storeDir: v.ARTIFACT_STORE_DIR,
    cacheDir: v.ARTIFACT_CACHE_DIR,
    gcIntervalMs: v.ARTIFACT_GC_INTERVAL_MS,
    gcGraceMs: v.ARTIFACT_GC_GRACE_MS,
    imageCacheMaxBytes: v.IMAGE_CACHE_MAX_MIB * 1024 * 1024,
  };
}
