// Built images over the shared artifact store, as every Node program composes them: a host fetches what it lacks, a
// builder publishes what it built (images/build/host-images.ts over fleet-agent/artifacts/dir-store.ts and the images rows).
import type { Logger } from "../lib/log.ts";
import type { Db } from "../schema/db.ts";
import { createDirArtifactStore } from "../fleet-agent/artifacts/dir-store.ts";
import type { ArtifactStoreConfig } from "../fleet-agent/artifacts/config.ts";
import { createHostImages, type HostImages } from "../images/build/host-images.ts";
import { createImageRepo } from "../images/repo.ts";

export function composeHostImages(o: {
  dataDir: string;
  artifacts: Pick<ArtifactStoreConfig, "storeDir" | "imageCacheMaxBytes">;
  db: Db;
  log: Logger;
  /** The digests awake VMs run now (a host's; a gateway alone runs none). */
  inUse?(): ReadonlySet<string>;
}): HostImages {
  const repo = createImageRepo(o.db);
  return createHostImages({
    dataDir: o.dataDir,
    // No local blob cache for images: a fetched image's own directory is this host's copy.
    ...(o.artifacts.storeDir ? { blobs: createDirArtifactStore({ root: o.artifacts.storeDir, log: o.log }) } : {}),
    configOf: (digest) => repo.byDigest(digest),
    maxBytes: o.artifacts.imageCacheMaxBytes,
    inUse: o.inUse ?? (() => new Set()),
    log: o.log,
  });
}
