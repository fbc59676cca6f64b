// bench:density's run as its parts see it: the options parsed by the main, the guest image, progress and cleanup.
import type { GuestImage } from "../../../fleet-agent/guest/build-image.ts";
import type { Cleanups } from "./cleanups.ts";

/** Each agent's RAM, MiB. */
export const MEM_MIB = 256;

export interface DensityRun {
  image: GuestImage;
  accel: "auto" | "kvm" | "tcg";
  /** Clones to create per filesystem (`--agents`). */
  agents: number;
  /** Cold-booted agents for the reference (`--cold`). */
  coldCount: number;
  /** Each awake clone's GET /counter period, ms (`--trickle-ms`). */
  trickleMs: number;
  /** Awake time before memory is measured, s (`--settle-s`). */
  settleS: number;
  /** Stop creating clones once one takes longer than this to answer, ms (`--give-up-ms`). */
  giveUpMs: number;
  say(line: string): void;
  cleanups: Cleanups;
}
