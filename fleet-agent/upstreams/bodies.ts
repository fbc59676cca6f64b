// Kept bodies of upstream calls, content-addressed: in the shared artifact store where the host has one, else in the same layout under the host's data directory.
import { createReadStream } from "node:fs";
import { mkdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { randomBytes } from "node:crypto";
import type { Readable } from "node:stream";
import type { ArtifactStore } from "../artifacts/store.ts";
import { createDirArtifactStore } from "../artifacts/dir-store.ts";
import type { BodyKeeper } from "../egress/upstreams.ts";

/** `store`: the shared artifact store, or none (then `<dataDir>/upstream-bodies`, a store of the same kind on this host). */
export function createBodyKeeper(opts: { store: ArtifactStore | undefined; dataDir: string; scratchDir: string }): BodyKeeper {
  const store = opts.store ?? createDirArtifactStore({ root: join(opts.dataDir, "upstream-bodies") });
  return {
    async keep(file) {
      return (await store.put(file)).digest;
    },
    async open(digest) {
      // The store hands blobs over as verified files: one is fetched to scratch, streamed, then removed.
      await mkdir(opts.scratchDir, { recursive: true, mode: 0o700 });
      const file = join(opts.scratchDir, `replay-${randomBytes(8).toString("hex")}`);
      await store.get(digest, file);
      const stream: Readable = createReadStream(file);
      stream.once("close", () => void rm(file, { force: true }));
      return stream;
    },
  };
}
