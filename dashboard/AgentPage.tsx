// One agent: its state, its runs (what woke it, how the wake's time went, how long it ran and dozed, the upstream calls it made, what put it to sleep), its last operations (calls through upstreams), its log's tail, its usage plots.
import { useState } from "preact/hooks";
import { getJson, getText, withQuery } from "./api.ts";
import { ago, browserZone, formatMs, localDate, localTime } from "./format.ts";
import { usePoll } from "./poll.ts";
import { hrefs, Link } from "./route.tsx";
import { StateBadge } from "./Agents.tsx";
import { UsagePlots } from "./UsagePlots.tsx";
import { Operations } from "./Operations.tsx";
import type { Agent, Rates, Run, RunsPage, UsageReport } from "./types.ts";
import { useDesktopViewers } from "./desktop-viewers.ts";

const runsPerPage = 20;
/** The log's tail shown, bytes. */
const logTailBytes = 16_384;
const hourMs = 3_600_000;

export function AgentPage(props: { id: string }) {
  const path = `/v1/agents/${encodeURIComponent(props.id)}`;
  const agent = usePoll(() => getJson<Agent>(path), [props.id]);
  const now = Date.now();
  const a = agent.data;
  return (
    <main>
      <p>
        <Link href={hrefs.agents()}>← Agents</Link>
      </p>
      <h1>{a?.name ?? props.id}</h1>
      {agent.error ? (
        <p class="error" role="alert">
          {agent.error.message}
        </p>
      ) : null}
      {a ? (
        <dl class="facts">
          <dt>State</dt>
          <dd>
            <StateBadge state={a.state} />
          </dd>
          <dt>Last wake</dt>
          <dd title={a.lastWakeAt ?? ""}>{ago(a.lastWakeAt, now)}</dd>
          <dt>Image</dt>
          <dd class="mono">{a.image}</dd>
          <dt>Size</dt>
          <dd>
            {a.vcpus} vCPU · {a.memMiB} MiB
          </dd>
          <dt>Sleeps after</dt>
          <dd>{formatMs(a.idleTimeoutMs)} idle</dd>
          <dt>In flight · leases</dt>
          <dd>
            {a.inFlight} · {a.leases}
          </dd>
          {a.desktop ? (
            <>
              <dt>Desktop</dt>
              <dd>
                {a.desktop.width}×{a.desktop.height} ·{" "}
                <Link href={hrefs.desktop(a.id)} class="desktop-link">
                  Open the desktop
                </Link>
                <DesktopViewersNow id={a.id} />
              </dd>
            </>
          ) : null}
          <dt>Id</dt>
          <dd class="mono">{a.id}</dd>
        </dl>
      ) : null}
      {a?.lastHibernateError ? (
        <p class="error">
          Hibernate failing ({a.lastHibernateError.attempts}×): {a.lastHibernateError.message}
        </p>
      ) : null}
      <Runs path={path} />
      <Operations path={path} />
      <AgentUsage id={props.id} />
      <Logs path={path} />
    </main>
  );
}

/** Who watches the desktop now (a viewer holds the agent awake with a lease), and who has control. */
function DesktopViewersNow(props: { id: string }) {
  const { list, holder, count } = useDesktopViewers(props.id);
  if (list.length === 0) return null;
  return (
    <span data-testid="agent-desktop-viewers">
      {" "}
      · {count}
      {holder ? `, ${holder.actor} has control` : ""}
    </span>
  );
}

function timing(ms: number | undefined) {
  return ms === undefined ? <span class="muted">—</span> : formatMs(ms);
}

function Runs(props: { path: string }) {
  const first = usePoll(() => getJson<RunsPage>(withQuery(`${props.path}/runs`, { limit: runsPerPage })), [props.path]);
  const [older, setOlder] = useState<{ runs: Run[]; next: Record<string, string> | undefined }>({ runs: [], next: undefined });
  const [olderError, setOlderError] = useState<string | undefined>();
  const page = first.data;
  const shown = page ? [...page.runs, ...older.runs.filter((r) => !page.runs.some((p) => p.runId === r.runId))] : [];
  const nextOf = (p: RunsPage): Record<string, string> | undefined => (p.nextCursor ? { cursor: p.nextCursor } : undefined);
  const next = older.runs.length > 0 ? older.next : page && nextOf(page);
  const loadOlder = async () => {
    if (!next) return;
    try {
      const p = await getJson<RunsPage>(withQuery(`${props.path}/runs`, { limit: runsPerPage, ...next }));
      setOlder((o) => ({ runs: [...o.runs, ...p.runs], next: nextOf(p) }));
    } catch (err) {
      setOlderError(err instanceof Error ? err.message : String(err));
    }
  };
  const now = Date.now();
  return (
    <section>
      <h2>Runs</h2>
      {first.error ? (
        <p class="error" role="alert">
          {first.error.message}
        </p>
      ) : null}
      {page && shown.length === 0 ? <p class="muted">No runs yet: the first call to the agent wakes it.</p> : null}
      {shown.length > 0 ? (
        <table class="runs">
          <thead>
            <tr>
              <th>Woke</th>
              <th>Woken by</th>
              <th>Mode</th>
              <th title="waiting for a wake slot">Queue</th>
              <th title="snapshot restore, or cold boot">Restore / boot</th>
              <th title="setting the guest's clock after a restore">Clock fix</th>
              <th title="from the wake's start to the first byte of the answer">First byte</th>
              <th>Ran for</th>
              <th>Active</th>
              <th title="vCPUs stopped while every open call waited on an outbound call (a model call): not active time">Dozed</th>
              <th title="calls through upstreams during the run, and the time they waited for their first byte">Operations</th>
              <th>Put to sleep by</th>
            </tr>
          </thead>
          <tbody>
            {shown.map((r) => (
              <tr key={r.runId} data-run-id={r.runId} data-testid="run">
                <td title={r.wokeAt}>{localTime(r.wokeAt)}</td>
                <td>{r.wakeReason}</td>
                <td>{r.wakeMode}</td>
                <td data-timing="queuedMs">{timing(r.timings.queuedMs)}</td>
                <td data-timing={r.timings.restoreMs !== undefined ? "restoreMs" : "bootMs"}>
                  {timing(r.timings.restoreMs ?? r.timings.bootMs)}
                  {r.timings.rollbackMs !== undefined ? <div class="error small">rolled back {formatMs(r.timings.rollbackMs)}</div> : null}
                </td>
                <td data-timing="clockFixMs">{timing(r.timings.clockFixMs)}</td>
                <td data-timing="firstByteMs">{timing(r.timings.firstByteMs)}</td>
                <td>
                  {r.awakeMs !== null ? formatMs(r.awakeMs) : `${formatMs(Math.max(0, now - Date.parse(r.wokeAt)))} so far`}
                  {r.viewerMs > 0 ? (
                    <div
                      class="muted small"
                      data-testid="run-viewers"
                      title="a desktop viewer was connected (it holds the agent awake); with control: a human had the keyboard"
                    >
                      viewed {formatMs(r.viewerMs)}
                      {r.controlMs > 0 ? ` · control ${formatMs(r.controlMs)}` : ""}
                    </div>
                  ) : null}
                </td>
                <td>{formatMs(r.activeMs)}</td>
                <td data-testid="run-dozed">{formatMs(r.dozedMs)}</td>
                <td data-testid="run-operations" title={`tokens in ${r.inputTokens}, out ${r.outputTokens}`}>
                  {r.operations > 0 ? `${r.operations} · waited ${formatMs(r.upstreamWaitMs)}` : "0"}
                </td>
                <td>{r.sleepReason ?? <span class="muted">awake</span>}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : null}
      {next ? (
        <button type="button" class="secondary" onClick={() => void loadOlder()}>
          Older runs
        </button>
      ) : null}
      {olderError ? <p class="error">{olderError}</p> : null}
    </section>
  );
}

/** The plot's range: the last 24 local hours, or the last 30 local days, each up to the end of the current one. */
function rangeOf(unit: "hour" | "day", now: number): { from: string; to: string; fromMs: number; toMs: number } {
  if (unit === "hour") {
    const hourStart = new Date(now);
    hourStart.setMinutes(0, 0, 0);
    const to = hourStart.getTime() + hourMs;
    const from = to - 24 * hourMs;
    return { from: new Date(from).toISOString(), to: new Date(to).toISOString(), fromMs: from, toMs: to };
  }
  const today = new Date(now);
  const first = new Date(today.getFullYear(), today.getMonth(), today.getDate() - 29);
  const tomorrow = new Date(today.getFullYear(), today.getMonth(), today.getDate() + 1);
  return { from: localDate(first), to: localDate(tomorrow), fromMs: first.getTime(), toMs: tomorrow.getTime() };
}

function AgentUsage(props: { id: string }) {
  const [unit, setUnit] = useState<"hour" | "day">("hour");
  const usage = usePoll(
    async () => {
      const range = rangeOf(unit, Date.now());
      const [report, rates] = await Promise.all([
        getJson<UsageReport>(withQuery("/v1/usage", { from: range.from, to: range.to, groupBy: unit, agentId: props.id, tz: browserZone() })),
        getJson<Rates>("/v1/rate-card"),
      ]);
      return { report, rates, range };
    },
    [props.id, unit],
    10_000,
  );
  const u = usage.data;
  return (
    <section>
      <h2>
        Usage{" "}
        <span class="toggle">
          <button type="button" class={unit === "hour" ? "on" : ""} onClick={() => setUnit("hour")}>
            per hour
          </button>
          <button type="button" class={unit === "day" ? "on" : ""} onClick={() => setUnit("day")}>
            per day
          </button>
        </span>
      </h2>
      {usage.error ? (
        <p class="error" role="alert">
          {usage.error.message}
        </p>
      ) : null}
      {u ? <UsagePlots rows={u.report.rows} from={u.range.fromMs} to={u.range.toMs} unit={unit} rates={u.rates} /> : null}
    </section>
  );
}

function Logs(props: { path: string }) {
  const log = usePoll(() => getText(withQuery(`${props.path}/logs`, { tail: logTailBytes })), [props.path]);
  return (
    <section>
      <h2>Log</h2>
      {log.error ? (
        <p class="error" role="alert">
          {log.error.message}
        </p>
      ) : null}
      <pre class="log" data-testid="log">
        {log.data === undefined ? "" : log.data === "" ? "(nothing logged yet)" : log.data}
      </pre>
    </section>
  );
}
