// Child of image-build-crash.test.ts: builds the context in argv[2] into the data dir argv[3], printing each event as a JSON line, until it is killed.
import { buildImage } from "../../images/build/index.ts";

const [context, dataDir, cacheDir] = process.argv.slice(2) as [string, string, string];
const artifact = await buildImage({ kind: "containerfile", input: context, dataDir, cacheDir, onEvent: (e) => console.log(JSON.stringify(e)) });
console.log(JSON.stringify({ type: "done", digest: artifact.digest }));
