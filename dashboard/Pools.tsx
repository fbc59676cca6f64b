// The tenant's warm pools: each one's checkpoint, how many of its agents are ready, in use and being made ready; refreshed every few seconds.
import { getJson } from "./api.ts";
import { ago } from "./format.ts";
import { usePoll } from "./poll.ts";
import type { PoolList } from "./types.ts";

export function Pools() {
  const { data, error } = usePoll(() => getJson<PoolList>("/v1/pools"), []);
  const now = Date.now();
  return (
    <main>
      <h1>Pools</h1>
      {error ? (
        <p class="error" role="alert">
          {error.message}
        </p>
      ) : null}
      {data === undefined ? (
        error ? null : (
          <p class="muted">Loading…</p>
        )
      ) : data.pools.length === 0 ? (
        <p class="muted">No pools yet: create one with POST /v1/pools (or agentvm pools create).</p>
      ) : (
        <table class="agents">
          <thead>
            <tr>
              <th>Name</th>
              <th>Checkpoint</th>
              <th title="hibernated, waiting to be handed out">Ready</th>
              <th>In use</th>
              <th title="forked by the top-up, or reset after a release">Resetting</th>
              <th title="ready agents kept · agents at most">Size</th>
              <th>Created</th>
            </tr>
          </thead>
          <tbody>
            {data.pools.map((p) => (
              <tr key={p.id} data-pool-id={p.id}>
                <td>
                  {p.name}
                  <div class="muted mono">{p.id}</div>
                  {p.state !== "active" ? <div class="error small">{p.state}</div> : null}
                </td>
                <td class="mono">{p.fromCheckpoint}</td>
                <td data-testid="pool-ready">{p.ready}</td>
                <td data-testid="pool-in-use">{p.inUse}</td>
                <td>{p.resetting}</td>
                <td>
                  {p.size} · max {p.maxSize}
                </td>
                <td title={p.createdAt}>{ago(p.createdAt, now)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </main>
  );
}
