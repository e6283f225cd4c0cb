// SVG charts drawn in the browser from query results: a line chart (with threshold bands and
// reference lines) and a state timeline. Part of fastllm-stack (Apache-2.0); no dependencies.
// Only DOM APIs: nothing here parses HTML, so label values can never become markup.

import { clockTime, formatValue } from "./format.js";

const NS = "http://www.w3.org/2000/svg";
const PAD = { left: 74, right: 10, top: 8, bottom: 20 };

function svg(tag, attrs, parent) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

function text(parent, x, y, content, attrs = {}) {
  const node = svg("text", { x, y, ...attrs }, parent);
  node.textContent = content;
  return node;
}

function frame(box, height) {
  const width = Math.max(box.clientWidth || 0, 240);
  box.replaceChildren();
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" }, box);
  return { root, width, height };
}

function extent(series, opts) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const s of series) {
    for (const [, v] of s.points) {
      if (Number.isFinite(v)) {
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
  }
  for (const line of opts.lines || []) {
    lo = Math.min(lo, line.value);
    hi = Math.max(hi, line.value);
  }
  if (!Number.isFinite(lo)) [lo, hi] = [0, 1];
  lo = opts.min ?? Math.min(0, lo);
  hi = opts.max ?? (hi > lo ? hi : lo + 1);
  hi = hi > lo ? hi : lo + 1;
  const step = niceStep((hi - lo) / 4);
  // round free bounds out to whole ticks; a panel's own min/max stay exact
  return [opts.min ?? Math.floor(lo / step) * step, opts.max ?? Math.ceil(hi / step) * step, step];
}

// 1, 2 or 5 times a power of ten: tick spacing people read at a glance
function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  const f = raw / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * power;
}

// series: [{name, color, points: [[t, v], ...]}]; opts: {unit, start, end, step, min, max,
// bands: [{from, to, color}], lines: [{value, color, label}], height}
export function lineChart(box, series, opts) {
  const { root, width, height } = frame(box, opts.height || 170);
  const [lo, hi, tick] = extent(series, opts);
  const x0 = PAD.left;
  const x1 = width - PAD.right;
  const y0 = height - PAD.bottom;
  const y1 = PAD.top;
  const x = (t) => x0 + ((t - opts.start) / (opts.end - opts.start || 1)) * (x1 - x0);
  const y = (v) => y0 - ((Math.min(Math.max(v, lo), hi) - lo) / (hi - lo)) * (y0 - y1);
  for (const band of opts.bands || []) {
    const top = y(Math.min(band.to, hi));
    const bottom = y(Math.max(band.from, lo));
    if (bottom > top) {
      svg("rect", { x: x0, y: top, width: x1 - x0, height: bottom - top, fill: band.color, "fill-opacity": 0.13 }, root);
    }
  }
  const first = Math.ceil(lo / tick) * tick;
  for (let i = 0, v = first; i < 12 && v <= hi + tick * 1e-9; i += 1, v = first + i * tick) {
    const at = Math.abs(v) < tick * 1e-9 ? 0 : v; // no "-0" from float steps
    svg("line", { x1: x0, x2: x1, y1: y(at), y2: y(at), class: "grid" }, root);
    text(root, x0 - 4, y(at) + 4, formatValue(at, opts.unit), { "text-anchor": "end", class: "tick" });
  }
  for (let i = 0; i <= 3; i += 1) {
    const t = opts.start + ((opts.end - opts.start) * i) / 3;
    const anchor = i === 0 ? "start" : i === 3 ? "end" : "middle";
    text(root, x(t), height - 5, clockTime(t), { "text-anchor": anchor, class: "tick" });
  }
  for (const line of opts.lines || []) {
    svg("line", { x1: x0, x2: x1, y1: y(line.value), y2: y(line.value), stroke: line.color, class: "ref" }, root);
    text(root, x1 - 2, y(line.value) - 3, line.label, { "text-anchor": "end", class: "tick", fill: line.color });
  }
  const gap = (opts.step || 1) * 1.5;
  for (const s of series) {
    let d = "";
    let last = null;
    for (const [t, v] of s.points) {
      if (!Number.isFinite(v)) {
        last = null;
        continue;
      }
      d += `${last === null || t - last > gap ? "M" : "L"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      last = t;
    }
    if (d) svg("path", { d, stroke: s.color, class: "series" }, root);
    if (d && !d.includes("L")) {
      const [t, v] = s.points.filter(([, w]) => Number.isFinite(w)).at(-1);
      svg("circle", { cx: x(t), cy: y(v), r: 2.5, fill: s.color }, root);
    }
  }
  return root;
}

// rows: [{name, points: [[t, v], ...]}]; paint(v) -> {color, text}
export function stateTimeline(box, rows, opts, paint) {
  const rowHeight = 22;
  const { root, width } = frame(box, rows.length * rowHeight + PAD.bottom + 4);
  const x0 = Math.min(140, width / 3);
  const x1 = width - PAD.right;
  const x = (t) => x0 + ((t - opts.start) / (opts.end - opts.start || 1)) * (x1 - x0);
  rows.forEach((row, i) => {
    const top = i * rowHeight + 2;
    text(root, 2, top + 15, row.name, { class: "tick" });
    for (const [t, v] of row.points) {
      const { color } = paint(v);
      const w = Math.max(x(t + opts.step) - x(t), 1);
      svg("rect", { x: x(t), y: top, width: w, height: rowHeight - 4, fill: color }, root);
    }
  });
  const bottom = rows.length * rowHeight + PAD.bottom;
  text(root, x0, bottom, clockTime(opts.start), { class: "tick" });
  text(root, x1, bottom, clockTime(opts.end), { class: "tick", "text-anchor": "end" });
  return root;
}
