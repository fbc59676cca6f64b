// Which desktops a human holds control of through the viewer's WebSocket, in this gateway: the actions API refuses them (409) meanwhile.
//
// Runtime-free, in memory: a gateway knows the takeovers it relays. Behind several gateways a takeover is known
// only to the one holding its socket (docs/desktop.md).

export interface DesktopControl {
  /** The caller's actor (the audit log's `actor`). */
  actor: string;
  since: Date;
}

export class DesktopControls {
  private held = new Map<string, DesktopControl>();

  /** Takes control of the agent's desktop; false when someone holds it already. */
  take(agentId: string, control: DesktopControl): boolean {
    if (this.held.has(agentId)) return false;
    this.held.set(agentId, control);
    return true;
  }

  release(agentId: string, control: DesktopControl): void {
    if (this.held.get(agentId) === control) this.held.delete(agentId);
  }

  holder(agentId: string): DesktopControl | undefined {
    return this.held.get(agentId);
  }
}
