// The job's operations views, fed by console.js's polling: the job graph, charts of the
// last five minutes (throughput, sink latency p99, backpressure), a heat map of key-group
// load per keyed operator, its controllers, and its workers' CPU and memory. Every chart
// marks the reconfigurations, recoveries, checkpoints and controller decisions of its time.
//
// The series (GET /jobs/{id}/metrics/series) and the controllers are read every
// SLOW_POLL_MS, not at every poll: a series is five minutes of points.

import { ApiError, api } from "./api.js";
import { LineChart, setMarkers } from "./charts.js";
import { decisionMarkers, readControllers, renderControllers } from "./controllers.js";
import { $, Palette, el, say } from "./dom.js";
import { clock, compact, epochSeconds, number } from "./format.js";
import { renderGraph, showTaskRates } from "./graph.js";
import { HeatMap } from "./heatmap.js";

const SERIES_WINDOW_S = 300; // the coordinator keeps this much history
const SERIES_STEP_S = 2; // tasks report every second: 2-s steps hold one to three reports each
const SLOW_POLL_MS = 4000; // the views read again this often ("every few seconds")

const workerColours = new Palette();
const operatorColours = new Palette();
const taskColours = new Palette();

const CHARTS = {
  throughput: { format: (x) => `${number(x, 0)}/s`, axis: (x) => `${compact(x)}/s` },
  latency: { format: (x) => `${number(x)} ms`, axis: (x) => `${compact(x)} ms` },
  backpressure: { format: (x) => `${number(x, 0)} %`, yRange: [0, 100] },
  cpu: { format: (x) => `${number(x, 0)} %` },
  rss: { format: (x) => `${number(x, 0)} MB`, axis: (x) => `${compact(x)} MB` },
};

const view = {
  readAt: -Infinity, // performance.now() of the last read of the series and controllers
  history: [], // markers of reconfigurations, recoveries and checkpoints
  decisions: [], // markers of controller decisions
  charts: null, // name -> LineChart, made with the first series
  heatmaps: new Map(), // keyed operator -> HeatMap
};

/** Forget the job shown (another is chosen): its charts, heat maps, graph, controllers. */
export function resetViews() {
  for (const chart of Object.values(view.charts ?? {})) chart.destroy();
  for (const heatmap of view.heatmaps.values()) heatmap.destroy();
  Object.assign(view, { readAt: -Infinity, history: [], decisions: [], charts: null, heatmaps: new Map() });
  $("#graph").replaceChildren();
  $("#graph-legend").replaceChildren();
  $("#heatmaps").replaceChildren();
  for (const table of ["#controllers", "#decisions", "#controller-logs"]) $(table).tBodies[0].replaceChildren();
  say($("#series-status"), "");
  say($("#controllers-status"), "");
  setMarkers([]);
}

/** Read the series and the controllers again at the next poll. */
export function readSoon() {
  view.readAt = -Infinity;
}

function heatmapOf(operator) {
  if (!view.heatmaps.has(operator)) {
    const figure = el("figure", { "data-testid": "heatmap", "data-operator": operator });
    figure.append(el("figcaption", {}, `${operator}: records per second in each key group`));
    $("#heatmaps").append(figure);
    view.heatmaps.set(operator, new HeatMap(figure, taskColours));
  }
  return view.heatmaps.get(operator);
}

/** A new version of the abstraction: the graph, and who owns which key groups now. */
export function showAbstraction(abstraction) {
  renderGraph($("#graph"), $("#graph-legend"), abstraction, workerColours);
  for (const op of abstraction.operators) {
    if (op.kind === "keyed") heatmapOf(op.name).showOwners(op);
  }
}

/** The metrics window's per-task rates, in the graph's task boxes. */
export function showTaskMetrics(metrics) {
  showTaskRates($("#graph"), metrics);
}

/** Mark ``reconfigurations`` (recoveries among them) and ``checkpoints`` on the charts. */
export function showHistory(reconfigurations, checkpoints) {
  const now = Date.now() / 1000;
  const changes = reconfigurations.map((r) => ({
    kind: r.origin === "recovery" ? "recovery" : "reconfiguration",
    id: r.id,
    from: epochSeconds(r.created_at),
    to: r.ended_at ? epochSeconds(r.ended_at) : now,
    status: r.status,
    title: `${r.origin === "recovery" ? "Recovery" : "Reconfiguration"} ${r.id} (${r.origin}) ${r.status}`,
  }));
  const taken = checkpoints.map((c) => {
    const at = epochSeconds(c.started_at) + (c.duration_ms ?? 0) / 1000;
    return { kind: "checkpoint", id: c.checkpoint_id, from: at, to: at, status: c.status, title: `Checkpoint ${c.checkpoint_id} ${c.status}` };
  });
  view.history = [...changes, ...taken];
  setMarkers([...view.history, ...view.decisions]);
}

function charts() {
  view.charts ??= Object.fromEntries(
    Object.entries(CHARTS).map(([name, options]) => [name, new LineChart($(`[data-testid="chart-${name}"]`), options)]),
  );
  return view.charts;
}

/** The time axis of every chart: from the first step with a report (a job younger than the
 * window fills the width) to the last. */
function timeRange(series) {
  const { times, step_s: step } = series;
  const reported = (i) => series.operators.some((o) => o.in_per_s[i] != null || o.out_per_s[i] != null);
  const first = Math.max(0, times.findIndex((_, i) => reported(i)));
  return [times[first] - step, times.at(-1)];
}

function showSeries(series) {
  const { times, step_s: step, operators: ops, workers } = series;
  const range = timeRange(series);
  const byOperator = (o, label, values) => ({ label, values, colour: operatorColours.of(o.operator) });
  const byWorker = (w, values) => ({ label: w.worker, values, colour: workerColours.of(w.worker) });
  const percent = (values) => values.map((x) => (x == null ? null : x * 100));
  const lines = {
    throughput: ops.map((o) =>
      o.kind === "source"
        ? byOperator(o, `${o.operator} (out)`, o.out_per_s)
        : byOperator(o, o.operator, o.in_per_s),
    ),
    latency: ops.filter((o) => o.p99_ms).map((o) => byOperator(o, `${o.operator} p99`, o.p99_ms)),
    backpressure: ops.map((o) => byOperator(o, o.operator, percent(o.backpressure))),
    cpu: workers.map((w) => byWorker(w, w.cpu_percent)),
    rss: workers.map((w) => byWorker(w, w.rss_mb)),
  };
  for (const [name, chart] of Object.entries(charts())) chart.update(times, lines[name], range);
  for (const load of series.key_groups) heatmapOf(load.operator).update(times, load, step, range);
  say(
    $("#series-status"),
    `Up to the last ${number(series.window_s / 60)} minutes in ${number(step)}-s steps: ` +
      `${clock(range[0])} to ${clock(range[1])}.`,
  );
}

async function readSeries(job, live) {
  if (!live) {
    say($("#series-status"), `The job is ${job.status}: the charts take no new points.`);
    return null;
  }
  try {
    return await api(`/jobs/${job.id}/metrics/series?window_s=${SERIES_WINDOW_S}&step_s=${SERIES_STEP_S}`);
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 409) throw error;
    say($("#series-status"), error.message); // e.g. not deployed since the control plane restarted
    return null;
  }
}

/** Every SLOW_POLL_MS: the series (of a ``live`` job) and the controllers of ``job``;
 * ``current()`` says whether it is still the job shown once they have been read. */
export async function refreshViews(job, live, current) {
  if (performance.now() - view.readAt < SLOW_POLL_MS) return;
  view.readAt = performance.now();
  const [series, controllers] = await Promise.all([readSeries(job, live), readControllers(job.id)]);
  if (!current()) return;
  if (series) showSeries(series);
  renderControllers(controllers);
  view.decisions = decisionMarkers(controllers);
  setMarkers([...view.history, ...view.decisions]);
}
