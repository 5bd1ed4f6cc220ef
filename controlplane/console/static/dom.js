// DOM helpers (elements, table rows, status lines) and the colours the views share.

export const $ = (selector) => document.querySelector(selector);

function build(node, props, children) {
  for (const [key, value] of Object.entries(props)) {
    if (value == null) continue;
    if (key === "class") node.setAttribute("class", value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c != null).map((c) => (c instanceof Node ? c : `${c}`)));
  return node;
}

/** An HTML element; text children are text nodes, never parsed as HTML. */
export const el = (tag, props = {}, ...children) => build(document.createElement(tag), props, children);

/** An SVG element, as el builds HTML ones. */
export const svg = (tag, props = {}, ...children) =>
  build(document.createElementNS("http://www.w3.org/2000/svg", tag), props, children);

export const cell = (text, className) => el("td", { class: className }, text);
export const num = (text) => cell(text, "num");

export function fill(table, rows, emptyText) {
  const columns = table.tHead.rows[0].cells.length;
  const body = table.tBodies[0];
  if (rows.length) body.replaceChildren(...rows);
  else body.replaceChildren(el("tr", {}, el("td", { colspan: columns, class: "empty" }, emptyText)));
}

export const statusBadge = (status) => el("span", { class: `badge ${status}`, "data-status": status }, status);

export function say(target, message, kind = "info") {
  target.textContent = message;
  target.dataset.kind = kind;
}

// Tableau 10: distinct on light and dark backgrounds.
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

/** Colours given out in the order names are first asked for, the same name always the same. */
export class Palette {
  constructor() {
    this.given = new Map();
  }

  of(name) {
    if (!this.given.has(name)) this.given.set(name, PALETTE[this.given.size % PALETTE.length]);
    return this.given.get(name);
  }
}

/** The value of a CSS custom property of the page (its light or dark theme). */
export const cssVar = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();
