// The job graph: one box per operator, holding a box per task coloured by the worker it is
// placed on, and an arrow per input labelled with its partitioning. Operators are laid out
// in columns by depth (a source is at depth 0, an operator one deeper than its deepest
// input), in the abstraction's order within a column.

import { el, svg } from "./dom.js";
import { number, percent, workloadText } from "./format.js";

const COLUMN_W = 200; // an operator box
const COLUMN_GAP = 90; // room for an edge's label
const MARGIN = 16;
const HEADER_H = 40; // operator name and kind
const TASK_H = 24;
const TASK_GAP = 4;
const OPERATOR_GAP = 24; // between operators of one column

function depths(operators) {
  const depth = new Map();
  for (const op of operators) {
    // The abstraction lists operators in topological order: inputs come first.
    const inputs = op.inputs.map((i) => depth.get(i.upstream) ?? 0);
    depth.set(op.name, op.inputs.length ? 1 + Math.max(...inputs) : 0);
  }
  return depth;
}

/** Where each operator's box is: {x, y, h}, and the drawing's size. */
function layout(operators) {
  const depth = depths(operators);
  const bottom = []; // per column, where the next box goes
  const boxes = new Map();
  for (const op of operators) {
    const column = depth.get(op.name);
    const h = HEADER_H + op.tasks.length * (TASK_H + TASK_GAP) + TASK_GAP;
    const y = bottom[column] ?? MARGIN;
    boxes.set(op.name, { x: MARGIN + column * (COLUMN_W + COLUMN_GAP), y, h });
    bottom[column] = y + h + OPERATOR_GAP;
  }
  const width = MARGIN * 2 + bottom.length * COLUMN_W + (bottom.length - 1) * COLUMN_GAP;
  const height = Math.max(...bottom, MARGIN) - OPERATOR_GAP + MARGIN;
  return { boxes, width, height };
}

function edge(from, to, input, target) {
  const x1 = from.x + COLUMN_W;
  const y1 = from.y + from.h / 2;
  const x2 = to.x;
  const y2 = to.y + to.h / 2;
  const bend = (x2 - x1) / 2;
  return svg(
    "g",
    {
      class: "edge",
      "data-testid": "graph-edge",
      "data-from": input.upstream,
      "data-to": target,
      "data-partitioning": input.partitioning,
    },
    svg("path", {
      d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2 - 2} ${y2}`,
      "marker-end": "url(#graph-arrow)",
    }),
    svg("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 6, "text-anchor": "middle" }, input.partitioning),
  );
}

function taskBox(task, x, y, colour) {
  const worker = task.resources.worker;
  const about = `${task.id} on ${worker}: ${workloadText(task.workload)}`;
  return svg(
    "g",
    { class: "task", "data-testid": "graph-task", "data-task": task.id, "data-worker": worker, "data-about": about },
    svg("title", {}, about),
    svg("rect", { x, y, width: COLUMN_W - 16, height: TASK_H, rx: 4, fill: colour, stroke: colour }),
    svg("text", { x: x + 8, y: y + TASK_H / 2 + 4 }, task.id),
    svg("text", { x: x + COLUMN_W - 24, y: y + TASK_H / 2 + 4, "text-anchor": "end", "data-rate-of": task.id }, ""),
  );
}

/** Draw ``abstraction`` into ``container`` (an SVG) and its workers into ``legend``. */
export function renderGraph(container, legend, abstraction, workerColours) {
  const operators = abstraction.operators;
  const { boxes, width, height } = layout(operators);
  const arrow = svg(
    "marker",
    { id: "graph-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
    svg("path", { d: "M 0 0 L 10 5 L 0 10 z" }),
  );
  const edges = operators.flatMap((op) =>
    op.inputs.map((input) => edge(boxes.get(input.upstream), boxes.get(op.name), input, op.name)),
  );
  const nodes = operators.map((op) => {
    const { x, y, h } = boxes.get(op.name);
    const keyed = op.kind === "keyed" ? `, ${op.max_parallelism} key groups` : "";
    return svg(
      "g",
      { class: "operator", "data-testid": "graph-operator", "data-operator": op.name },
      svg("rect", { x, y, width: COLUMN_W, height: h, rx: 6 }),
      svg("text", { x: x + 8, y: y + 17, class: "name" }, op.name),
      svg("text", { x: x + 8, y: y + 32, class: "kind" }, `${op.transform}, ${op.tasks.length} tasks${keyed}`),
      ...op.tasks.map((task, i) =>
        taskBox(task, x + 8, y + HEADER_H + i * (TASK_H + TASK_GAP), workerColours.of(task.resources.worker)),
      ),
    );
  });
  container.replaceChildren(svg("defs", {}, arrow), ...edges, ...nodes);
  container.setAttribute("viewBox", `0 0 ${width} ${height}`);
  container.setAttribute("width", width);
  container.setAttribute("height", height);

  const hosted = new Map(abstraction.workers.map((w) => [w.id, 0]));
  for (const op of operators) for (const t of op.tasks) hosted.set(t.resources.worker, (hosted.get(t.resources.worker) ?? 0) + 1);
  legend.replaceChildren(
    ...[...hosted].map(([worker, tasks]) =>
      el(
        "li",
        { "data-testid": "graph-worker", "data-worker": worker },
        el("span", { class: "swatch", style: `background:${workerColours.of(worker)}` }),
        `${worker}: ${tasks} task${tasks === 1 ? "" : "s"}`,
      ),
    ),
  );
}

/** Each task's rate from the metrics window, in its box (sources: out, others: in). */
export function showTaskRates(container, metrics) {
  const kinds = new Map(metrics.operators.map((op) => [op.operator, op.kind]));
  for (const task of metrics.tasks) {
    const text = container.querySelector(`[data-rate-of="${CSS.escape(task.task)}"]`);
    if (!text) continue;
    const rate = kinds.get(task.operator) === "source" ? task.out_per_s : task.in_per_s;
    text.textContent = `${number(rate, 0)}/s`;
    const box = text.parentNode;
    box.querySelector("title").textContent =
      `${box.dataset.about}\n${number(rate, 0)} records/s, busy ${percent(task.busy)}, ` +
      `backpressure ${percent(task.backpressure)}`;
  }
}
