// The streampilot dashboard: a plain client of /api/v1 (no build step; uPlot, vendored,
// for the charts).
//
// Every POLL_MS it reads the jobs and, for the selected job (#job=ID in the address),
// its reconfigurations (recoveries among them), checkpoints and metrics window; it reads
// the abstraction again only when the job's version changes. The operations views (graph,
// charts, heat maps, controllers, workers: views.js) read their own data every few
// seconds. Data goes into the page with textContent, never as HTML.

import { ApiError, api, auth, scopeHint, storeToken } from "./api.js";
import { $, cell, el, fill, num, say, statusBadge } from "./dom.js";
import { bytes, milliseconds, number, percent, when, workloadText } from "./format.js";
import { listenToControllerButtons } from "./controllers.js";
import { readSoon, refreshViews, resetViews, showAbstraction, showHistory, showTaskMetrics } from "./views.js";

const POLL_MS = 2000; // the metrics are ~1 s snapshots: faster polling shows nothing new
const METRICS_WINDOW_S = 5; // long enough to smooth one-second snapshots, short enough to react
const JOBS_SHOWN = 50;
const RECONFIGURATIONS_SHOWN = 20;
const CHECKPOINTS_SHOWN = 10; // the newest; the REST API pages through the rest
const CHECKPOINTS_MARKED = 200; // on the charts: five minutes of checkpoints 1.5 s apart
const CONNECTED = "Connected: the token is accepted.";
const LIVE = new Set(["starting", "running", "reconfiguring", "recovering"]); // jobs with metrics to read
const ENDED = new Set(["completed", "failed", "aborted", "cancelled"]); // reconfigurations

const state = {
  jobId: null,
  shownVersion: null, // abstraction version in the tasks table
  operators: [], // of the shown abstraction, for the action forms
  timer: null,
  generation: 0, // of the polling loop: a restarted loop ends the one before it
  authFailed: false, // stop polling after a 401/403 until another token is given
  launched: null, // id of the reconfiguration sent from this page, until it ends
  missingJob: null, // id of a job asked for that does not exist, until another is chosen
};

// ---- rendering ----------------------------------------------------------------------

function renderJobs(page) {
  const rows = page.items.map((job) =>
    el(
      "tr",
      {
        "data-testid": "job-row",
        "data-job-id": job.id,
        "aria-current": job.id === state.jobId ? "true" : null,
      },
      el("td", {}, el("a", { href: `#job=${job.id}`, "data-testid": "job-link" }, `${job.id}`)),
      cell(job.name),
      cell(el("code", {}, job.job)),
      el("td", { "data-testid": "job-row-status" }, statusBadge(job.status)),
      num(job.version ?? "—"),
      cell(when(job.created_at)),
    ),
  );
  fill($("#jobs"), rows, "No jobs yet: submit one with POST /api/v1/jobs or `streampilot job submit`.");
  $("#jobs-caption").textContent =
    page.total > page.items.length
      ? `Newest ${page.items.length} of ${page.total}; choose one to see its tasks, metrics and reconfigurations.`
      : "Newest first; choose one to see its tasks, metrics and reconfigurations.";
}

function renderJob(job) {
  $("#job-heading").textContent = `Job ${job.id}: ${job.name}`;
  $("#job-status").replaceChildren(statusBadge(job.status));
  $("#job-version").textContent = job.version ?? "—";
  $("#job-ref").replaceChildren(el("code", {}, job.job));
  $("#job-error-row").hidden = !job.error;
  $("#job-error").textContent = job.error ?? "";
}

function renderAbstraction(abstraction) {
  const rows = abstraction.operators.flatMap((op) =>
    op.tasks.map((task) =>
      el(
        "tr",
        { "data-testid": "task-row", "data-task": task.id, "data-operator": op.name },
        cell(op.name),
        el("th", { scope: "row" }, task.id),
        el("td", { "data-testid": "task-workload" }, workloadText(task.workload)),
        el("td", { "data-testid": "task-worker" }, task.resources.worker),
        cell(el("code", {}, `${task.logic.ref} (v${task.logic.version})`)),
      ),
    ),
  );
  fill($("#tasks"), rows, "This job has no tasks.");
  $("#tasks-caption").textContent =
    `Abstraction version ${abstraction.job.version}: ${rows.length} tasks on ` +
    `${abstraction.workers.length} workers.`;
  state.operators = abstraction.operators;
  for (const select of [$("#scale-operator"), $("#rebalance-operator")]) {
    const chosen = select.value;
    select.replaceChildren(
      ...abstraction.operators.map((op) => el("option", { value: op.name }, `${op.name} (${op.kind})`)),
    );
    const keyed = abstraction.operators.find((op) => op.kind === "keyed");
    select.value = state.operators.some((op) => op.name === chosen) ? chosen : (keyed ?? abstraction.operators[0])?.name ?? "";
  }
  showParallelism();
}

function showParallelism() {
  const op = state.operators.find((o) => o.name === $("#scale-operator").value);
  if (op) $("#scale-parallelism").value = op.tasks.length;
}

function renderMetrics(metrics) {
  const order = state.operators.map((op) => op.name); // the abstraction's, source to sink
  const rank = (name) => (order.includes(name) ? order.indexOf(name) : order.length);
  const operators = [...metrics.operators].sort((a, b) => rank(a.operator) - rank(b.operator));
  const rows = operators.map((op) =>
    el(
      "tr",
      { "data-testid": "operator-metrics-row", "data-operator": op.operator },
      el("th", { scope: "row" }, op.operator),
      cell(op.kind),
      el("td", { class: "num", "data-testid": "operator-tasks" }, op.tasks),
      el("td", { class: "num", "data-testid": "rate-in" }, number(op.in_per_s)),
      el("td", { class: "num", "data-testid": "rate-out" }, number(op.out_per_s)),
      num(percent(op.busy)),
      num(percent(op.backpressure)),
      num(number(op.queued, 0)),
      el("td", { class: "num", "data-testid": "operator-state" }, bytes(op.state_bytes)),
    ),
  );
  fill($("#operator-metrics"), rows, "No task has reported yet.");
  const latency = metrics.latency;
  const ms = (x) => (latency.count ? `${number(x)} ms` : "—");
  $('[data-testid="latency-p50"]').textContent = ms(latency.p50_ms);
  $('[data-testid="latency-p95"]').textContent = ms(latency.p95_ms);
  $('[data-testid="latency-p99"]').textContent = ms(latency.p99_ms);
  $('[data-testid="latency-max"]').textContent = ms(latency.max_ms);
  $('[data-testid="latency-count"]').textContent = number(latency.count, 0);
  say(
    $("#metrics-status"),
    `Last ${number(metrics.window_s)} s, ${metrics.samples} snapshots; updated ${new Date().toLocaleTimeString()}.`,
  );
}

function renderNoMetrics(message) {
  fill($("#operator-metrics"), [], message);
  for (const dd of $("#latency").querySelectorAll("dd")) dd.textContent = "—";
  say($("#metrics-status"), message);
}

function modeText(rec) {
  if (rec.mode !== "fluid") return rec.mode;
  return rec.batch_size == null ? "fluid, one step" : `fluid, ${rec.batch_size} per step`;
}

function runsText(rec) {
  const runs = rec.runs == null ? "—" : `${rec.runs}`;
  const stages = rec.stage_ms.length;
  return stages ? `${runs} + ${stages} stage${stages === 1 ? "" : "s"}` : runs;
}

function precopyTitle(rec) {
  const t = rec.timings_ms;
  if (t.precopy == null) return "";
  const workers = Object.entries(rec.precopied).map(
    ([w, c]) =>
      `${w}: ${bytes(c.bytes)} in ${number(c.ms)} ms (waiting for idle moments ${number(c.waited_ms)}, ` +
      `for the receiver ${number(c.room_ms)}, sending ${number(c.sending_ms)})`,
  );
  return [`of which ${number(t.precopy)} ms copying state ahead`, ...workers].join("\n");
}

// A recovery's record, under its row: why, from which checkpoint, which workers it replaced.
function recoveryRow(rec) {
  const why = rec.recovery;
  const columns = $("#reconfigurations").tHead.rows[0].cells.length;
  const lost = why.lost_workers.length ? why.lost_workers.join(", ") : "none";
  const placed = Object.entries(why.placed_on).map(([w, by]) => `${w} → ${by}`);
  const t = why.timings_ms;
  const fact = (label, testid, value, title) =>
    el("div", {}, el("dt", {}, label), el("dd", { "data-testid": testid, title }, value));
  return el(
    "tr",
    { "data-testid": "recovery-row", "data-id": rec.id, class: "detail" },
    el(
      "td",
      { colspan: columns },
      el(
        "dl",
        { class: "facts" },
        fact("Recovered from checkpoint", "recovery-checkpoint", `${why.checkpoint_id}`),
        fact("after", "recovery-reason", why.reason),
        fact("Lost workers", "recovery-lost", lost),
        fact("placed on", "recovery-placed", placed.join(", ") || "—"),
        fact(
          "Total",
          "recovery-total",
          milliseconds(t.total),
          `halt ${milliseconds(t.halt)}, place ${milliseconds(t.place)}, restore ${milliseconds(t.restore)}`,
        ),
      ),
    ),
  );
}

function renderReconfigurations(page) {
  const rows = page.items.flatMap((rec) => {
    const t = rec.timings_ms;
    const pauses = Object.values(rec.pause_ms);
    const row = el(
      "tr",
      { "data-testid": "reconfiguration-row", "data-id": rec.id, "data-status": rec.status },
      el("th", { scope: "row" }, `${rec.id}`),
      cell(rec.origin),
      el("td", { "data-testid": "reconfiguration-status" }, statusBadge(rec.status)),
      el("td", { "data-testid": "reconfiguration-mode" }, modeText(rec)),
      el(
        "td",
        {
          "data-testid": "reconfiguration-runs",
          title: rec.stage_ms.length ? `stages, ms: ${rec.stage_ms.map((x) => number(x)).join(", ")}` : "",
        },
        runsText(rec),
      ),
      cell(rec.result_version == null ? `${rec.base_version} →` : `${rec.base_version} → ${rec.result_version}`),
      el("td", { "data-testid": "affected-tasks" }, rec.affected_tasks.join(", ") || "—"),
      el(
        "td",
        {
          class: "num",
          "data-testid": "timing-prepare",
          title: precopyTitle(rec),
        },
        number(t.prepare),
      ),
      el("td", { class: "num", "data-testid": "timing-sync" }, number(t.sync)),
      el("td", { class: "num", "data-testid": "timing-update" }, number(t.update)),
      el("td", { class: "num", "data-testid": "timing-total" }, number(t.total)),
      num(pauses.length ? number(Math.max(...pauses)) : "—"),
      el("td", { "data-testid": "reconfiguration-error" }, rec.error ?? ""),
      el(
        "td",
        {},
        ENDED.has(rec.status)
          ? ""
          : el(
              "button",
              {
                type: "button",
                "data-testid": "cancel-reconfiguration",
                "data-id": rec.id,
                title: "Stop it at its next safe point (a change in pause mode already moving state cannot stop)",
              },
              `Cancel ${rec.id}`,
            ),
      ),
    );
    return rec.recovery ? [row, recoveryRow(rec)] : [row];
  });
  fill($("#reconfigurations"), rows, "No reconfiguration or recovery yet.");
  const launched = page.items.find((rec) => rec.id === state.launched);
  if (launched && ENDED.has(launched.status)) {
    state.launched = null;
    const outcome = launched.error
      ? `: ${launched.error}`
      : ` in ${number(launched.timings_ms.total)} ms`;
    say(
      $("#action-status"),
      `Reconfiguration ${launched.id} (${launched.origin}) ${launched.status}${outcome}.`,
      launched.status === "completed" || launched.status === "cancelled" ? "info" : "error",
    );
  }
}

function renderCheckpoints(page) {
  const rows = page.items.map((c) =>
    el(
      "tr",
      { "data-testid": "checkpoint-row", "data-id": c.checkpoint_id, "data-status": c.status },
      el("th", { scope: "row" }, `${c.checkpoint_id}`),
      el("td", { "data-testid": "checkpoint-status" }, statusBadge(c.status)),
      el("td", { class: "num", "data-testid": "checkpoint-version" }, c.version ?? "—"),
      el("td", { class: "num", "data-testid": "checkpoint-bytes", title: `${c.bytes} bytes` }, bytes(c.bytes)),
      el(
        "td",
        { class: "num", "data-testid": "checkpoint-full-bytes", title: `${c.full_bytes} bytes` },
        bytes(c.full_bytes),
      ),
      el("td", { class: "num", "data-testid": "checkpoint-duration" }, milliseconds(c.duration_ms)),
      cell(when(c.started_at)),
      el("td", { "data-testid": "checkpoint-error" }, c.error ?? ""),
    ),
  );
  fill($("#checkpoints"), rows, "No checkpoint yet (a job submitted with checkpoints off takes none).");
  $("#checkpoints-caption").textContent =
    page.total > page.items.length
      ? `Newest ${page.items.length} of ${page.total}: written is what changed since the one before, full size what a restore reads.`
      : "Newest first: written is what changed since the one before, full size what a restore reads.";
}

// ---- polling ------------------------------------------------------------------------

function authProblem(error) {
  if (!(error instanceof ApiError) || (error.status !== 401 && error.status !== 403)) return false;
  const what =
    error.status === 401
      ? "The server does not accept this token (401)"
      : "This token lacks the scope for that (403)";
  say($("#auth-status"), `${what}: ${error.message}`, "error");
  return true;
}

async function refreshJob(job) {
  renderJob(job);
  const id = job.id;
  const requests = [
    api(`/jobs/${id}/reconfigurations?limit=${RECONFIGURATIONS_SHOWN}`),
    api(`/jobs/${id}/checkpoints?limit=${CHECKPOINTS_MARKED}`),
  ];
  if (job.version !== state.shownVersion) requests.push(api(`/jobs/${id}/abstraction`));
  const [reconfigurations, checkpoints, abstraction] = await Promise.all(requests);
  if (id !== state.jobId) return; // another job was chosen meanwhile
  renderReconfigurations(reconfigurations);
  renderCheckpoints({ ...checkpoints, items: checkpoints.items.slice(0, CHECKPOINTS_SHOWN) });
  if (abstraction) {
    renderAbstraction(abstraction);
    showAbstraction(abstraction);
    state.shownVersion = abstraction.job.version;
  }
  showHistory(reconfigurations.items, checkpoints.items);
  const live = LIVE.has(job.status);
  if (!live) {
    renderNoMetrics(`The job is ${job.status}: no live metrics.`);
  } else {
    try {
      const metrics = await api(`/jobs/${id}/metrics?window_s=${METRICS_WINDOW_S}`);
      if (id === state.jobId) {
        renderMetrics(metrics);
        showTaskMetrics(metrics);
      }
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 409) throw error;
      renderNoMetrics(error.message); // e.g. not deployed since the control plane restarted
    }
  }
  await refreshViews(job, live, () => id === state.jobId);
}

// The chosen job when it is not among the newest listed; null (and the choice undone)
// when it does not exist. Only this 404 means that: one on a job's part is an error.
async function chosenJob() {
  try {
    return await api(`/jobs/${state.jobId}`);
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 404) throw error;
    state.missingJob = state.jobId;
    say($("#auth-status"), `Job ${state.jobId} does not exist.`, "error");
    location.hash = "";
    return null;
  }
}

async function refresh() {
  if (!auth.token || state.authFailed) return;
  try {
    const jobs = await api(`/jobs?limit=${JOBS_SHOWN}`);
    const [notice, kind] =
      state.missingJob == null ? [CONNECTED, "info"] : [`Job ${state.missingJob} does not exist.`, "error"];
    if ($("#auth-status").textContent !== notice) say($("#auth-status"), notice, kind);
    renderJobs(jobs);
    if (state.jobId != null) {
      const job = jobs.items.find((j) => j.id === state.jobId) ?? (await chosenJob());
      if (job) await refreshJob(job);
    }
  } catch (error) {
    if (authProblem(error)) {
      state.authFailed = true;
    } else {
      say($("#auth-status"), `Could not read the control plane: ${error.message}`, "error");
    }
  }
}

function poll() {
  const generation = ++state.generation;
  clearTimeout(state.timer);
  const tick = async () => {
    await refresh();
    if (generation === state.generation && auth.token && !state.authFailed) {
      state.timer = setTimeout(tick, POLL_MS);
    }
  };
  tick();
}

// ---- user actions -------------------------------------------------------------------

function selectFromHash() {
  const match = /^#job=(\d+)$/.exec(location.hash);
  state.jobId = match ? Number(match[1]) : null;
  if (state.jobId != null) state.missingJob = null;
  state.shownVersion = null;
  $("#job").hidden = state.jobId == null;
  for (const table of ["#tasks", "#operator-metrics", "#reconfigurations", "#checkpoints"]) {
    $(table).tBodies[0].replaceChildren();
  }
  say($("#action-status"), "");
  say($("#metrics-status"), state.jobId == null ? "" : "Loading…");
  resetViews();
  for (const row of document.querySelectorAll('[data-testid="job-row"]')) {
    if (Number(row.dataset.jobId) === state.jobId) row.setAttribute("aria-current", "true");
    else row.removeAttribute("aria-current");
  }
}

// How the scale and rebalance forms make their change: {mode, batch_size or batch_bytes},
// or null (and the reason said) when the step is neither a whole number of key groups of
// at least 1 nor a size of state with its unit.
const SIZE_UNITS = { b: 1, kb: 1e3, mb: 1e6, gb: 1e9, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30 };

function pace() {
  const mode = $("#action-mode").value;
  const batch = $("#action-batch").value.trim();
  if (mode !== "fluid" || batch === "") return { mode };
  if (/^\d+$/.test(batch) && Number(batch) >= 1) return { mode, batch_size: Number(batch) };
  const size = /^(\d+(?:\.\d+)?)\s*([kmg]i?b|b)$/i.exec(batch);
  if (size && Number(size[1]) * SIZE_UNITS[size[2].toLowerCase()] >= 1) {
    return { mode, batch_bytes: Math.floor(Number(size[1]) * SIZE_UNITS[size[2].toLowerCase()]) };
  }
  say(
    $("#action-status"),
    `Key groups per step must be a whole number of at least 1 or a size of state such as 8MB (or empty: all in one step), not "${batch}".`,
    "error",
  );
  return null;
}

async function reconfigure(kind, body) {
  const how = pace();
  if (how === null) return;
  body = { ...body, ...how };
  const status = $("#action-status");
  say(status, `Sending ${kind}…`);
  try {
    const rec = await api(`/jobs/${state.jobId}/${kind}`, { method: "POST", body });
    say(status, `Reconfiguration ${rec.id} (${rec.origin}) accepted: ${rec.status}.`);
    state.launched = rec.id;
    poll();
  } catch (error) {
    say(status, `${kind} refused${scopeHint(error)}: ${error.message}`, "error");
  }
}

function previewText(kind, seen) {
  const steps = seen.steps > 1 ? ` in ${seen.steps} steps` : "";
  const shipped =
    seen.state_bytes_shipped == null
      ? "the keyed state it would ship is not measured yet"
      : `about ${bytes(seen.state_bytes_shipped)} of keyed state shipped between workers` +
        (seen.steps > 1 ? ` (${bytes(seen.largest_step_bytes)} in its largest step)` : "");
  const parts = [`${seen.key_group_moves} key groups would change task`, shipped];
  const tasks = (field) => seen.diff.operators.flatMap((op) => op[field].map((t) => (Array.isArray(t) ? t[0] : t)));
  for (const [field, label] of [
    ["new_tasks", "new tasks"],
    ["removed_tasks", "removed tasks"],
    ["moved_tasks", "moved tasks"],
  ]) {
    if (tasks(field).length) parts.push(`${label} ${tasks(field).join(", ")}`);
  }
  return (
    `Preview: ${kind} would take version ${seen.base_version} to ${seen.result_version}${steps}: ` +
    `${parts.join("; ")}. Nothing was changed.`
  );
}

async function preview(kind, body) {
  const how = pace();
  if (how === null) return;
  const status = $("#action-status");
  say(status, `Previewing ${kind}…`);
  try {
    const seen = await api(`/jobs/${state.jobId}/reconfigurations/preview`, {
      method: "POST",
      body: { origin: kind, ...body, ...how },
    });
    say(status, previewText(kind, seen));
  } catch (error) {
    say(status, `${kind} would be refused${scopeHint(error)}: ${error.message}`, "error");
  }
}

async function cancelReconfiguration(id) {
  const status = $("#action-status");
  say(status, `Cancelling reconfiguration ${id}…`);
  try {
    const rec = await api(`/jobs/${state.jobId}/reconfigurations/${id}/cancel`, { method: "POST" });
    say(status, `Reconfiguration ${rec.id} (${rec.origin}) stops at its next safe point.`);
    state.launched = rec.id; // its outcome is said when it has ended
    poll();
  } catch (error) {
    say(status, `Cancel refused${scopeHint(error)}: ${error.message}`, "error");
  }
}

function setToken(token) {
  storeToken(token);
  state.authFailed = false;
  if (auth.token) {
    say($("#auth-status"), "Token saved in this browser; reading the control plane…");
    poll();
  } else {
    clearTimeout(state.timer);
    $("#jobs").tBodies[0].replaceChildren();
    location.hash = "";
    say($("#auth-status"), "No token: enter one to see the jobs.", "error");
  }
}

function start() {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("#token");
    setToken(input.value.trim());
    input.value = "";
  });
  $("#token-forget").addEventListener("click", () => setToken(null));
  $("#scale-operator").addEventListener("change", showParallelism);
  const paceInputs = () => {
    $("#action-batch").disabled = $("#action-mode").value !== "fluid";
  };
  $("#action-mode").addEventListener("change", paceInputs);
  paceInputs(); // a reload may have restored the mode
  const scaleBody = () => ({
    operator: $("#scale-operator").value,
    parallelism: Number($("#scale-parallelism").value),
  });
  const rebalanceBody = () => ({ operator: $("#rebalance-operator").value });
  $("#scale-form").addEventListener("submit", (event) => {
    event.preventDefault();
    reconfigure("scale", scaleBody());
  });
  $('[data-testid="scale-preview"]').addEventListener("click", () => preview("scale", scaleBody()));
  $('[data-testid="rebalance-preview"]').addEventListener("click", () =>
    preview("rebalance", rebalanceBody()),
  );
  $("#reconfigurations").addEventListener("click", (event) => {
    const button = event.target.closest('[data-testid="cancel-reconfiguration"]');
    if (button) cancelReconfiguration(Number(button.dataset.id));
  });
  $("#rebalance-form").addEventListener("submit", (event) => {
    event.preventDefault();
    reconfigure("rebalance", rebalanceBody());
  });
  listenToControllerButtons(() => {
    readSoon();
    poll();
  });
  for (const button of document.querySelectorAll("[data-view]")) {
    button.addEventListener("click", () => $(`#${button.dataset.view}`).scrollIntoView({ behavior: "smooth" }));
  }
  window.addEventListener("hashchange", () => {
    selectFromHash();
    poll();
  });

  selectFromHash();
  if (auth.token) {
    say($("#auth-status"), "Using the token saved in this browser.");
    poll();
  } else {
    say($("#auth-status"), "No token: enter one to see the jobs.", "error");
  }
}

start();
