// A keyed operator's load per key group over time: x time, y key group, each cell coloured
// by its records per second (uPlot's heat-map approach: the cells are drawn on its canvas
// by a draw hook, over its axes and scales). A stripe on the right says which task owns
// each key group now, coloured as the legend under the chart.
//
// The chart's element keeps the cells drawn with load as `element.dataset.cells`.

import { baseOptions, createChart, destroyChart } from "./charts.js";
import { el } from "./dom.js";
import { clock, keyGroupRanges, number } from "./format.js";

const HEIGHT = 260;
const STRIPE = 10; // px: the owners' stripe, right of the plot
const STRIPE_GAP = 4;

// Viridis, dark purple (cool) to yellow (hot): ordered at a glance on either theme.
const RAMP = [
  [68, 1, 84],
  [59, 82, 139],
  [33, 145, 140],
  [94, 201, 98],
  [253, 231, 37],
];
const LEVELS = 64;

/** The colour of each share of the busiest cell's load, in steps of 1 / LEVELS; on a
 * square-root scale, so that a long tail of cool key groups stays visible. */
const SHADES = Array.from({ length: LEVELS + 1 }, (_, i) => {
  const at = Math.sqrt(i / LEVELS) * (RAMP.length - 1);
  const k = Math.min(Math.floor(at), RAMP.length - 2);
  const [a, b] = [RAMP[k], RAMP[k + 1]];
  const mix = (c) => Math.round(a[c] + (b[c] - a[c]) * (at - k));
  return `rgb(${mix(0)},${mix(1)},${mix(2)})`;
});

export class HeatMap {
  /** In ``container``: the chart, then the owners' legend and a readout of the cursor. */
  constructor(container, taskColours) {
    this.container = container;
    this.taskColours = taskColours;
    this.chart = el("div", { class: "chart heatmap", "data-testid": "heatmap-chart" });
    this.readout = el("p", { class: "hint", "aria-live": "polite" }, "Point at a cell to read it.");
    this.owners = el("ul", { class: "legend", "data-testid": "heatmap-owners" });
    container.append(this.chart, this.owners, this.readout);
    this.load = null; // KeyGroupLoad of the series
    this.owner = new Map(); // key group -> task
    this.groups = 1; // the operator's key groups (max_parallelism)
  }

  /** The operator as the abstraction has it now: its key groups and their owners. */
  showOwners(operator) {
    this.groups = operator.max_parallelism ?? 1;
    this.owner = new Map();
    for (const task of operator.tasks) for (const g of task.workload.key_groups ?? []) this.owner.set(g, task.id);
    this.owners.replaceChildren(
      ...operator.tasks.map((task) => {
        const groups = task.workload.key_groups ?? [];
        return el(
          "li",
          { "data-testid": "heatmap-owner", "data-task": task.id },
          el("span", { class: "swatch", style: `background:${this.taskColours.of(task.id)}` }),
          `${task.id} on ${task.resources.worker}: ${groups.length ? keyGroupRanges(groups) : "no key group"} (${groups.length})`,
        );
      }),
    );
    this.container.uplot?.redraw(false);
  }

  /** The series' load of this operator (KeyGroupLoad) over ``times`` (steps of ``stepS``),
   * shown over ``range`` ([from, to] of the time axis). */
  update(times, load, stepS, range) {
    this.load = load;
    this.stepS = stepS;
    this.max = load.records_per_s.reduce((m, row) => row.reduce((a, b) => Math.max(a, b), m), 0);
    this.xRange = range;
    const data = [times, times.map(() => null)];
    if (this.chart.uplot) {
      this.chart.uplot.setData(data);
      return;
    }
    const options = baseOptions(this.chart, {
      height: HEIGHT,
      yAxis: { values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? `${t}` : "")), label: "key group" },
      plugins: [this.plugin()],
    });
    options.padding = [8, STRIPE + STRIPE_GAP + 4, 0, 0];
    options.legend = { show: false };
    options.scales.x.range = () => this.xRange;
    options.scales.y = { range: () => [-0.5, this.groups - 0.5] };
    options.series = [{}, { label: "load", stroke: "transparent", points: { show: false }, paths: () => null }];
    createChart(this.chart, options, data);
  }

  plugin() {
    return {
      hooks: {
        draw: [(u) => this.draw(u)],
        setCursor: [(u) => this.read(u)],
      },
    };
  }

  draw(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    let cells = 0;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    const times = u.data[0];
    const rows = this.load?.records_per_s ?? [];
    const y = (g) => u.valToPos(g, "y", true);
    this.load?.groups.forEach((group, i) => {
      const y0 = y(group + 0.5);
      const h = y(group - 0.5) - y0;
      rows[i].forEach((value, j) => {
        if (!(value > 0)) return;
        const x0 = u.valToPos(times[j] - this.stepS, "x", true);
        const x1 = u.valToPos(times[j], "x", true);
        ctx.fillStyle = SHADES[Math.round((value / this.max) * LEVELS)];
        ctx.fillRect(x0, y0, Math.max(1, x1 - x0), Math.max(1, h));
        cells += 1;
      });
    });
    ctx.restore();
    // The owners' stripe, right of the plot.
    const x = left + width + STRIPE_GAP * uPlot.pxRatio;
    for (let g = 0; g < this.groups; g++) {
      const task = this.owner.get(g);
      if (!task) continue;
      const y0 = y(g + 0.5);
      ctx.fillStyle = this.taskColours.of(task);
      ctx.fillRect(x, y0, STRIPE * uPlot.pxRatio, Math.max(1, y(g - 0.5) - y0));
    }
    this.chart.dataset.cells = cells;
  }

  read(u) {
    const { idx, top } = u.cursor;
    if (idx == null || top == null || top < 0 || !this.load) return;
    const group = Math.round(u.posToVal(top, "y"));
    const row = this.load.groups.indexOf(group);
    const value = row < 0 ? 0 : this.load.records_per_s[row][idx];
    const owner = this.owner.get(group);
    this.readout.textContent =
      `Key group ${group} (${owner ?? "no task"} now), ` +
      `${clock(u.data[0][idx] - this.stepS)}–${clock(u.data[0][idx])}: ${number(value)} records/s ` +
      `(the busiest cell: ${number(this.max)}/s).`;
  }

  destroy() {
    destroyChart(this.chart);
    this.container.replaceChildren();
  }
}
