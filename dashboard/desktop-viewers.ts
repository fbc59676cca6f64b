// Who watches a desktop agent's screen, polled (`GET /v1/agents/{id}/desktop/viewers`), as the viewer page and the agent's page both show it.
import { getJson } from "./api.ts";
import { usePoll, type Polled } from "./poll.ts";
import type { DesktopViewers } from "./types.ts";

export type Viewer = DesktopViewers["viewers"][number];

export interface ViewersNow {
  polled: Polled<DesktopViewers>;
  list: Viewer[];
  /** The viewer holding control, if one does. */
  holder: Viewer | undefined;
  /** "1 viewer", "3 viewers". */
  count: string;
}

export function useDesktopViewers(agentId: string): ViewersNow {
  const polled = usePoll(() => getJson<DesktopViewers>(`/v1/agents/${encodeURIComponent(agentId)}/desktop/viewers`), [agentId]);
  const list = polled.data?.viewers ?? [];
  return { polled, list, holder: list.find((v) => v.mode === "control"), count: `${list.length} viewer${list.length === 1 ? "" : "s"}` };
}
