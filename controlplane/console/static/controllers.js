// The controllers attached to the job: each one's state with a Start or Stop button
// (operate scope), their decisions newest first (plan, outcome, reconfiguration, error) and
// their newest log lines. Decisions are also marked on the charts (views.js).

import { api, scopeHint } from "./api.js";
import { $, cell, el, fill, say, statusBadge } from "./dom.js";
import { epochSeconds, number, planSummary, when } from "./format.js";

const CONTROLLERS_READ = 50; // a job has a few; the REST API pages through more
const DECISIONS_READ = 50; // per controller, newest first: a 5-minute chart's worth
const LOGS_READ = 20; // per controller
const DECISIONS_SHOWN = 30;
const LOGS_SHOWN = 30;

/** The job's controllers, each with its newest decisions and log lines. */
export async function readControllers(jobId) {
  const page = await api(`/controllers?job_id=${jobId}&limit=${CONTROLLERS_READ}`);
  return Promise.all(
    page.items.map(async (controller) => {
      const [decisions, logs] = await Promise.all([
        api(`/controllers/${controller.id}/decisions?limit=${DECISIONS_READ}`),
        api(`/controllers/${controller.id}/logs?limit=${LOGS_READ}`),
      ]);
      return { controller, decisions: decisions.items, logs: logs.items };
    }),
  );
}

const newestFirst = (a, b) => epochSeconds(b.time) - epochSeconds(a.time);

function controllerRow({ controller: c }) {
  const running = c.status === "running";
  return el(
    "tr",
    { "data-testid": "controller-row", "data-id": c.id, "data-status": c.status },
    el("th", { scope: "row" }, `${c.id}`),
    cell(c.name),
    cell(el("code", {}, c.builtin ?? `${c.filename}: ${c.class_name}`)),
    el("td", { "data-testid": "controller-status" }, statusBadge(c.status)),
    cell(`${number(c.interval_s)} s`),
    cell(c.last_decision_at ? when(c.last_decision_at) : "—"),
    el("td", { class: "num" }, `${c.failures}`),
    el("td", { "data-testid": "controller-error" }, c.error ?? ""),
    el(
      "td",
      {},
      el(
        "button",
        {
          type: "button",
          "data-testid": running ? "controller-stop" : "controller-start",
          "data-id": c.id,
          "data-action": running ? "stop" : "start",
        },
        running ? `Stop ${c.id}` : `Start ${c.id}`,
      ),
    ),
  );
}

function decisionRow(d) {
  return el(
    "tr",
    { "data-testid": "decision-row", "data-id": d.id, "data-status": d.status },
    cell(when(d.time)),
    cell(d.controller),
    el("td", { "data-testid": "decision-plan" }, planSummary(d.plan)),
    el("td", { class: "num" }, `${d.moves}`),
    el("td", { "data-testid": "decision-status" }, statusBadge(d.status)),
    cell(d.reconfiguration_id ?? "—"),
    el("td", { "data-testid": "decision-error" }, d.error ?? ""),
  );
}

function logLine(line) {
  return el(
    "tr",
    { "data-testid": "controller-log", "data-source": line.source },
    cell(when(line.time)),
    cell(line.controller),
    cell(line.source),
    el("td", {}, el("code", {}, line.message)),
  );
}

/** Show what readControllers read. */
export function renderControllers(read) {
  fill($("#controllers"), read.map(controllerRow), "No controller is attached to this job.");
  const named = (key) =>
    read.flatMap(({ controller, [key]: items }) => items.map((x) => ({ ...x, controller: controller.name })));
  const decisions = named("decisions").sort(newestFirst).slice(0, DECISIONS_SHOWN);
  fill($("#decisions"), decisions.map(decisionRow), "No decision yet.");
  const logs = named("logs").sort(newestFirst).slice(0, LOGS_SHOWN);
  fill($("#controller-logs"), logs.map(logLine), "Nothing logged yet.");
}

/** Chart markers of the decisions: {kind, id, from, to, title, status}. */
export function decisionMarkers(read) {
  return read.flatMap(({ controller, decisions }) =>
    decisions.map((d) => ({
      kind: "decision",
      id: d.id,
      from: epochSeconds(d.time),
      to: epochSeconds(d.time),
      status: d.status,
      title: `${controller.name} decided: ${planSummary(d.plan)} — ${d.status}${d.error ? `: ${d.error}` : ""}`,
    })),
  );
}

/** Start or stop a controller from its button; ``then`` reads them again. */
export function listenToControllerButtons(then) {
  $("#controllers").addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button) return;
    const { id, action } = button.dataset;
    const status = $("#controllers-status");
    say(status, `${action === "stop" ? "Stopping" : "Starting"} controller ${id}…`);
    try {
      const c = await api(`/controllers/${id}/${action}`, { method: "POST" });
      say(status, `Controller ${c.id} (${c.name}) is ${c.status}.`);
      then();
    } catch (error) {
      say(status, `${action} refused${scopeHint(error)}: ${error.message}`, "error");
    }
  });
}
