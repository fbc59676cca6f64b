// An agent's last calls through its tenant's upstreams: when, what, the answer's status, the model and its tokens, how long it took.
import { getJson, withQuery } from "./api.ts";
import { formatMs, localTime } from "./format.ts";
import { usePoll } from "./poll.ts";
import type { OperationsPage } from "./types.ts";

const shown = 20;

export function Operations(props: { path: string }) {
  const ops = usePoll(() => getJson<OperationsPage>(withQuery(`${props.path}/operations`, { limit: shown })), [props.path]);
  const page = ops.data;
  return (
    <section>
      <h2>Operations</h2>
      {ops.error ? (
        <p class="error" role="alert">
          {ops.error.message}
        </p>
      ) : null}
      {page && page.operations.length === 0 ? <p class="muted">No calls through an upstream yet.</p> : null}
      {page && page.operations.length > 0 ? (
        <table class="runs">
          <thead>
            <tr>
              <th>Sent</th>
              <th>Upstream</th>
              <th>Call</th>
              <th>Status</th>
              <th>Model</th>
              <th title="input · output tokens">Tokens</th>
              <th title="from sent to the answer's end">Duration</th>
            </tr>
          </thead>
          <tbody>
            {page.operations.map((o) => (
              <tr key={o.id} data-testid="operation" data-operation-id={o.id}>
                <td title={o.createdAt}>{localTime(o.createdAt)}</td>
                <td>{o.upstream}</td>
                <td class="mono" title={o.path}>
                  {o.method} {o.path.length > 40 ? `${o.path.slice(0, 40)}…` : o.path}
                </td>
                <td>
                  {o.state === "in_flight" ? (
                    <span class="muted">in flight</span>
                  ) : o.status !== null ? (
                    o.status
                  ) : (
                    <span class="error" title={o.error?.message ?? ""}>
                      {o.error?.code ?? o.state}
                    </span>
                  )}
                </td>
                <td>{o.model ?? <span class="muted">—</span>}</td>
                <td>
                  {o.inputTokens !== null || o.outputTokens !== null ? `${o.inputTokens ?? "—"} · ${o.outputTokens ?? "—"}` : <span class="muted">—</span>}
                </td>
                <td>{o.durationMs !== null ? formatMs(o.durationMs) : <span class="muted">—</span>}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
    </section>
  );
}
