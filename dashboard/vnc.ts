// The desktop viewer's connection: noVNC's RFB over a WebSocket the page opens itself (the token as a subprotocol), so the close's code and reason are the page's to show. Loaded only by the viewer (its own chunk).
import RFB from "@novnc/novnc";

export interface ViewerEvents {
  /** The RFB handshake is done: the screen shows. */
  connected(): void;
  /** The socket closed (code and reason as the gateway gave them; 1006 when the upgrade was refused or the line broke). */
  closed(code: number, reason: string): void;
}

export interface Viewer {
  disconnect(): void;
}

/** Opens `/v1/agents/{id}/desktop/vnc` (with control: `?control=true`) and draws the screen into `target`. */
export function connectViewer(target: HTMLElement, opts: { agentId: string; token: string; control: boolean }, events: ViewerEvents): Viewer {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/v1/agents/${encodeURIComponent(opts.agentId)}/desktop/vnc${opts.control ? "?control=true" : ""}`;
  const ws = new WebSocket(url, ["binary", `agentvm.bearer.${opts.token}`]);
  ws.addEventListener("close", (e) => events.closed(e.code, e.reason), { once: true });
  const rfb = new RFB(target, ws, { shared: true });
  rfb.viewOnly = !opts.control;
  rfb.scaleViewport = true;
  rfb.focusOnClick = true;
  rfb.background = "#111";
  rfb.addEventListener("connect", () => {
    events.connected();
    if (opts.control) rfb.focus();
  });
  return {
    disconnect() {
      rfb.disconnect();
    },
  };
}
