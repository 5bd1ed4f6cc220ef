// Time charts drawn with uPlot (vendored: vendor/uplot-1.6.32, the global uPlot), sharing
// one time axis and one set of markers: reconfigurations and recoveries as bands from
// their creation to their end, checkpoints as ticks at the bottom, controller decisions as
// flags at the top. Markers are elements over the plot (not canvas drawing), so that each
// says what it is on hover and a test can find it.
//
// Each chart's element keeps its uPlot instance as `element.uplot`.

import { cssVar, el } from "./dom.js";
import { clock } from "./format.js";

const HEIGHT = 200; // px: five charts and a heat map fit a laptop screen two at a time
const DECISION_FLAG = 6; // px: half the width of a decision's flag
const TIME_LABEL_SPACE = 100; // px: at least this between time ticks ("12:40:25 PM" fits)

const timeLabels = (u, splits) => splits.map((t) => clock(t));

/** Every chart's markers: {kind, id, from, to, title, status}, times in epoch seconds. */
let markers = [];
const charts = new Set(); // the uPlot instances shown

/** uPlot options common to every chart: the time axis, colours, markers, resizing. */
export function baseOptions(container, { height = HEIGHT, yAxis = {}, plugins = [] } = {}) {
  const muted = cssVar("--muted");
  const grid = { stroke: cssVar("--line"), width: 1 };
  return {
    width: Math.max(container.clientWidth, 300),
    height,
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true } },
    axes: [
      // One row of local times, far enough apart not to overlap (uPlot's default adds a
      // row of dates, whose first label runs into the next tick's).
      { stroke: muted, grid, ticks: grid, space: TIME_LABEL_SPACE, values: timeLabels },
      { stroke: muted, grid, ticks: grid, size: 70, ...yAxis },
    ],
    plugins: [markerPlugin(), resizePlugin(container), ...plugins],
  };
}

/** Create a uPlot chart in ``container``; it is kept among the charts markers go on. */
export function createChart(container, options, data) {
  const u = new uPlot(options, data, container);
  container.uplot = u;
  charts.add(u);
  return u;
}

export function destroyChart(container) {
  if (!container.uplot) return;
  charts.delete(container.uplot);
  container.uplot.destroy();
  container.uplot = null;
}

/** Replace the markers of every chart. */
export function setMarkers(list) {
  markers = list;
  for (const u of charts) placeMarkers(u);
}

function markerPlugin() {
  return {
    hooks: {
      init: [(u) => u.over.append(el("div", { class: "markers" }))],
      draw: [placeMarkers],
    },
  };
}

function placeMarkers(u) {
  const layer = u.over.querySelector(".markers");
  const { min, max } = u.scales.x;
  if (!layer || min == null) return;
  const width = u.over.clientWidth;
  const shown = markers.filter((m) => m.to >= min && m.from <= max);
  layer.replaceChildren(
    ...shown.map((m) => {
      const left = Math.max(0, u.valToPos(m.from, "x"));
      const right = Math.min(width, u.valToPos(m.to, "x"));
      const style =
        m.kind === "decision"
          ? `left:${left - DECISION_FLAG}px`
          : m.kind === "checkpoint"
            ? `left:${left}px`
            : `left:${left}px;width:${Math.max(2, right - left)}px`;
      return el("div", {
        class: `marker ${m.kind} ${m.status ?? ""}`,
        style,
        title: `${m.title} (${clock(m.from)})`,
        "data-testid": "marker",
        "data-marker": m.kind,
        "data-id": m.id,
      });
    }),
  );
}

function resizePlugin(container) {
  let observer = null;
  return {
    hooks: {
      init: [
        (u) => {
          observer = new ResizeObserver(() => {
            const width = Math.max(container.clientWidth, 300);
            if (width !== u.width) u.setSize({ width, height: u.height });
          });
          observer.observe(container);
        },
      ],
      destroy: [() => observer?.disconnect()],
    },
  };
}

/**
 * A chart of lines over time: ``update(times, lines, range)`` with lines as
 * ``{label, values, colour}`` (values aligned with times, null for a gap) and ``range`` the
 * time axis's [from, to]. It is made again when the set of lines changes (an operator or a
 * worker comes or goes).
 */
export class LineChart {
  constructor(container, { format, axis = format, yRange = [0, null] }) {
    this.container = container;
    this.format = format; // value -> text, for the legend
    this.axis = axis; // value -> text, for the axis
    this.yRange = yRange; // [min, max]: null takes the data's
    this.signature = null;
  }

  update(times, lines, range) {
    const data = [times, ...lines.map((l) => l.values)];
    const signature = lines.map((l) => `${l.label}:${l.colour}`).join("|");
    if (signature === this.signature && this.container.uplot) {
      this.xRange = range;
      this.container.uplot.setData(data);
      return;
    }
    destroyChart(this.container);
    this.signature = signature;
    this.xRange = range;
    const { format, axis } = this;
    const [low, high] = this.yRange;
    const options = baseOptions(this.container, {
      yAxis: { values: (u, ticks) => ticks.map(axis) },
    });
    options.scales.x.range = () => this.xRange;
    options.scales.y = {
      range: (u, min, max) => [low ?? min, high ?? (max > 0 ? max * 1.1 : 1)],
    };
    options.series = [
      { value: (u, t) => (t == null ? "—" : clock(t)) },
      ...lines.map((l) => ({
        label: l.label,
        stroke: l.colour,
        width: 1.5,
        points: { show: false },
        value: (u, v) => (v == null ? "—" : format(v)),
      })),
    ];
    createChart(this.container, options, data);
  }

  destroy() {
    destroyChart(this.container);
    this.signature = null;
  }
}
