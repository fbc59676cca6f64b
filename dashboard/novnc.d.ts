// The part of noVNC's RFB class (@novnc/novnc, plain JavaScript) the desktop viewer uses: docs/API.md of the package.
declare module "@novnc/novnc" {
  export default class RFB extends EventTarget {
    constructor(target: HTMLElement, urlOrChannel: string | WebSocket, options?: { shared?: boolean; wsProtocols?: string[] });
    viewOnly: boolean;
    scaleViewport: boolean;
    focusOnClick: boolean;
    background: string;
    disconnect(): void;
    focus(): void;
  }
}
