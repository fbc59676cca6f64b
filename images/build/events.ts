// What a build reports while it runs: instruction steps, raw log lines, and progress per phase (the port's type, images/builds.ts).
export type { ImageBuildEvent as BuildEvent } from "../builds.ts";
