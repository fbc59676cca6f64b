// The exec and files routes' paths a runtime adapter must know before the app sees the request (the Node server's body rule for uploads).

/** `PUT /v1/agents/{id}/files…`: a file or a tar written into an agent, up to `maxFileBytes` (no total body deadline). */
export const agentFilesPath = /^\/v1\/agents\/[^/?]+\/files(?:\?|$)/;

/** The largest file (or tar of a tree) written into an agent in one call: the agent's own request-body limit does not apply. */
export const maxFileBytes = 4 * 1024 ** 3;
