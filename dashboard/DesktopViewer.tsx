// A desktop agent's screen (at /v1/agents/{id}/desktop and /dashboard/agents/{id}/desktop): watch it, take over its keyboard and pointer, see who else is there; a closed connection says why, and reconnecting wakes the agent.
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError, storedToken } from "./api.ts";
import { useDesktopViewers } from "./desktop-viewers.ts";
import { ago } from "./format.ts";
import { hrefs, Link } from "./route.tsx";
import type { Viewer } from "./vnc.ts";

type Status = { state: "connecting" } | { state: "connected" } | { state: "closed"; message: string };

/** What a close code means to the person watching (codes of gateway/exec/tty.ts `ttyClose`). */
function closedMessage(code: number, reason: string, control: boolean): string {
  if (code === 1001) return `The agent went to sleep (${reason || "going away"}). Reconnect to wake it.`;
  if (code === 1006)
    return control
      ? "Could not connect with control: someone else may hold it, or the token lacks desktop:control (or agents:admin)."
      : "Could not connect: the agent may have no desktop, or the token lacks agents:exec.";
  return `Disconnected (${code}${reason ? `: ${reason}` : ""}).`;
}

export function DesktopViewer(props: { id: string }) {
  const screen = useRef<HTMLDivElement>(null);
  const [control, setControl] = useState(false);
  const [attempt, setAttempt] = useState(0);
  const [status, setStatus] = useState<Status>({ state: "connecting" });
  const viewers = useDesktopViewers(props.id);

  useEffect(() => {
    const target = screen.current;
    const token = storedToken();
    if (!target || !token) return;
    let viewer: Viewer | undefined;
    let gone = false;
    setStatus({ state: "connecting" });
    void import("./vnc.ts").then(({ connectViewer }) => {
      if (gone) return;
      viewer = connectViewer(
        target,
        { agentId: props.id, token, control },
        {
          connected: () => !gone && setStatus({ state: "connected" }),
          closed: (code, reason) => !gone && setStatus({ state: "closed", message: closedMessage(code, reason, control) }),
        },
      );
    });
    return () => {
      gone = true;
      viewer?.disconnect();
      target.replaceChildren();
    };
  }, [props.id, control, attempt]);

  const { holder, count, polled } = viewers;
  return (
    <main class="desktop">
      <p>
        <Link href={hrefs.agent(props.id)}>← Agent {props.id}</Link>
      </p>
      <div class="desktop-bar">
        <span class="status" data-testid="desktop-status" data-state={status.state}>
          {status.state === "connecting" ? "Connecting… (waking the agent if it sleeps)" : null}
          {status.state === "connected" ? (control ? "Connected: you have control" : "Connected: view only") : null}
          {status.state === "closed" ? status.message : null}
        </span>
        <button type="button" data-testid="desktop-control" onClick={() => setControl(!control)}>
          {control ? "Give back control" : "Take control"}
        </button>
        {status.state === "closed" ? (
          <button type="button" class="secondary" onClick={() => setAttempt(attempt + 1)}>
            Reconnect
          </button>
        ) : null}
        <span class="muted" data-testid="desktop-viewers">
          {count}
          {holder ? ` · ${holder.actor} has control since ${ago(holder.since, Date.now())}` : " · nobody has control"}
        </span>
      </div>
      {polled.error && !(polled.error instanceof ApiError && polled.error.status === 404) ? (
        <p class="error" role="alert">
          {polled.error.message}
        </p>
      ) : null}
      <div class="desktop-screen" ref={screen} data-testid="desktop-screen" />
      <p class="muted small">
        While this page is open the agent stays awake (a keep-awake lease, on its bill). With control, the agent's own actions API waits, and the agent finds{" "}
        <code>/run/agentvm/desktop/control</code>.
      </p>
    </main>
  );
}
