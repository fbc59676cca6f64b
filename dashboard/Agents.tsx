// The tenant's agents: state, last wake, image, calls in flight, the pool an agent is in; refreshed every few seconds.
import { getAll } from "./api.ts";
import { ago } from "./format.ts";
import { usePoll } from "./poll.ts";
import { hrefs, Link } from "./route.tsx";
import type { Agent } from "./types.ts";

export function StateBadge(props: { state: string }) {
  return (
    <span class={`state state-${props.state}`} data-testid="agent-state">
      {props.state}
    </span>
  );
}

export function Agents() {
  const { data, error } = usePoll(() => getAll<Agent>("/v1/agents", "agents"), []);
  const now = Date.now();
  return (
    <main>
      <h1>Agents</h1>
      {error ? (
        <p class="error" role="alert">
          {error.message}
        </p>
      ) : null}
      {data === undefined ? (
        error ? null : (
          <p class="muted">Loading…</p>
        )
      ) : data.length === 0 ? (
        <p class="muted">No agents yet: create one with POST /v1/agents.</p>
      ) : (
        <table class="agents">
          <thead>
            <tr>
              <th>Name</th>
              <th>State</th>
              <th>Last wake</th>
              <th>Image</th>
              <th>Size</th>
              <th>In flight</th>
            </tr>
          </thead>
          <tbody>
            {data.map((a) => (
              <tr key={a.id} data-agent-id={a.id}>
                <td>
                  <Link href={hrefs.agent(a.id)}>{a.name}</Link>
                  <div class="muted mono">{a.id}</div>
                  {a.pool ? (
                    <div class="muted small" data-testid="agent-pool">
                      pool {a.pool.id} · {a.pool.state.replace("_", " ")}
                    </div>
                  ) : null}
                </td>
                <td>
                  <StateBadge state={a.state} />
                  {a.lastHibernateError ? <div class="error small">hibernate failing: {a.lastHibernateError.message}</div> : null}
                </td>
                <td title={a.lastWakeAt ?? ""}>{ago(a.lastWakeAt, now)}</td>
                <td class="mono">{a.image}</td>
                <td>
                  {a.vcpus} vCPU · {a.memMiB} MiB
                </td>
                <td>{a.inFlight}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </main>
  );
}
