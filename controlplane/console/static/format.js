// Numbers, sizes, times, key groups and plans as the console writes them.

/** Sorted key groups as compact ranges: [0,1,2,3,7,9,10] -> "0–3, 7, 9–10". */
export function keyGroupRanges(groups) {
  const sorted = [...groups].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) j++;
    parts.push(i === j ? `${sorted[i]}` : `${sorted[i]}–${sorted[j]}`);
    i = j + 1;
  }
  return parts.join(", ");
}

export const number = (x, digits = 1) =>
  x == null ? "—" : x.toLocaleString("en-US", { maximumFractionDigits: digits });
/** Short, for an axis: 1,234,567 -> "1.2M". */
export const compact = (x) => x.toLocaleString("en-US", { notation: "compact", maximumFractionDigits: 1 });
export const milliseconds = (x) => (x == null ? "—" : `${number(x)} ms`);
export const percent = (x) => `${Math.round(x * 100)} %`;
const UNITS = ["B", "kB", "MB", "GB", "TB"];
export function bytes(x) {
  if (x == null) return "—";
  let i = 0;
  while (x >= 1000 && i < UNITS.length - 1) {
    x /= 1000;
    i += 1;
  }
  return `${number(x, i ? 1 : 0)} ${UNITS[i]}`;
}
export const when = (iso) => new Date(iso).toLocaleString();
export const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString();

/** An API timestamp in seconds since the epoch (UTC when it names no zone). */
export function epochSeconds(iso) {
  const zoned = /(Z|[+-]\d\d:?\d\d)$/.test(iso) ? iso : `${iso}Z`;
  return Date.parse(zoned) / 1000;
}

export function workloadText(workload) {
  if (workload.key_groups) {
    const n = workload.key_groups.length;
    return n ? `${keyGroupRanges(workload.key_groups)} (${n})` : "none";
  }
  if (workload.partitions) {
    return workload.partitions.length ? `partitions ${workload.partitions.join(", ")}` : "no partition";
  }
  return `weight ${number(workload.weight, 3)}`;
}

/** A plan's operations in a few words (as `streampilot` prints a decision's). */
export function planSummary(plan) {
  const parts = (plan.ops ?? []).map((op) => {
    if (op.op === "assignWorkload") return `workload of ${Object.keys(op.workload).length} ${op.operator} tasks`;
    if (op.op === "assignResource") return `${op.task} → ${op.worker ?? "removed"}`;
    return `logic of ${op.operator} → ${op.ref}`;
  });
  return parts.join(", ") || "no operation";
}
