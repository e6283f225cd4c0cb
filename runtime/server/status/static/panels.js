// One dashboard panel on the status page: its frame, then its data drawn the way Grafana's
// panel type would (stat, bar gauge, table, time series, state timeline). Every panel ends in a
// visible state (data-state): ok, nodata, error, unsupported or sql, never silently blank.
// Part of fastllm-stack (Apache-2.0); no dependencies.

import { lineChart, stateTimeline } from "./charts.js";
import { color, formatValue, legendName, seriesColor } from "./format.js";

export const UTILIZATION_METRIC = "fastllm_device_utilization_ratio";

function make(tag, className, parent, content) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (content !== undefined) node.textContent = content;
  if (parent) parent.appendChild(node);
  return node;
}

export function panelShell(panel) {
  const el = make("article", "panel");
  el.dataset.key = panel.key;
  el.dataset.kind = panel.kind;
  el.dataset.state = "loading";
  el.style.gridColumn = `span ${Math.max(4, Math.min(24, panel.width))}`;
  const head = make("header", "", el);
  make("h3", "", head, panel.title);
  const badges = make("span", "badges", head);
  for (const name of panel.alert_names) {
    const badge = make("span", "badge", badges, name);
    badge.dataset.alert = name;
    badge.title = `alert rule ${name}`;
  }
  if (panel.description) make("p", "desc", el, panel.description);
  make("div", "body", el);
  make("p", "status", el);
  return el;
}

export function showState(el, state, message) {
  el.dataset.state = state;
  el.querySelector(".status").textContent = message || "";
  if (state !== "ok") el.querySelector(".body").replaceChildren();
}

function thresholdColor(panel, v) {
  let found = "green";
  for (const [from, name] of panel.thresholds) {
    if (from === null || v >= from) found = name;
  }
  return color(found);
}

function num(v) {
  return typeof v === "number" ? v : Number(v);
}

function samples(results) {
  const out = [];
  for (const { target, data } of results) {
    for (const r of data.result) {
      out.push({ name: legendName(target.legend, r.metric), metric: r.metric, value: num(r.value[1]) });
    }
  }
  return out;
}

function drawStat(panel, body, results) {
  const found = samples(results);
  for (const s of found) {
    const cell = make("div", "stat", body);
    const value = make("span", "stat-value", cell, formatValue(s.value, panel.unit));
    value.dataset.value = String(s.value);
    value.style.color = thresholdColor(panel, s.value);
    if (found.length > 1) make("span", "stat-name", cell, s.name);
  }
  return found.length;
}

function drawBars(panel, body, results) {
  const found = samples(results);
  const finite = found.map((s) => s.value).filter(Number.isFinite);
  const lo = panel.min_value ?? Math.min(0, ...finite);
  const hi = panel.max_value ?? Math.max(lo + 1e-12, ...finite);
  for (const s of found) {
    const row = make("div", "bar", body);
    make("span", "bar-name", row, s.name);
    const track = make("span", "bar-track", row);
    const fill = make("span", "bar-fill", track);
    const share = Number.isFinite(s.value) ? (s.value - lo) / (hi - lo || 1) : 0;
    fill.style.width = `${Math.max(0, Math.min(1, share)) * 100}%`;
    fill.style.background = thresholdColor(panel, s.value);
    make("span", "bar-value", row, formatValue(s.value, panel.unit)).dataset.value = String(s.value);
  }
  return found.length;
}

function drawTable(panel, body, results) {
  const found = samples(results);
  const keys = [...new Set(found.flatMap((s) => Object.keys(s.metric)))].filter((k) => k !== "__name__").sort();
  const table = make("table", "", body);
  const head = make("tr", "", make("thead", "", table));
  for (const k of [...keys, "Value"]) make("th", "", head, k);
  const rows = make("tbody", "", table);
  for (const s of found) {
    const tr = make("tr", "", rows);
    for (const k of keys) make("td", "", tr, s.metric[k] ?? "");
    make("td", "num", tr, formatValue(s.value, panel.unit));
  }
  return found.length;
}

function matrix(results) {
  const out = [];
  for (const { target, data } of results) {
    for (const r of data.result) {
      const points = r.values.map(([t, v]) => [t, num(v)]);
      out.push({ name: legendName(target.legend, r.metric), color: seriesColor(out.length), points });
    }
  }
  return out;
}

function bands(panel) {
  const steps = panel.thresholds;
  if (steps.length < 2) return [];
  return steps.map(([from, name], i) => ({
    from: from ?? -Infinity,
    to: i + 1 < steps.length ? steps[i + 1][0] : Infinity,
    color: color(name),
  }));
}

function drawSeries(panel, body, results, ctx) {
  const series = matrix(results);
  if (!series.length) return 0;
  const chart = make("div", "chart", body);
  const lines = [];
  if (ctx.band && panel.targets.some((t) => t.expr.includes(UTILIZATION_METRIC))) {
    lines.push({ value: ctx.band.min, color: "#8ab8ff", label: `control min ${formatValue(ctx.band.min, "percentunit")}` });
    lines.push({ value: ctx.band.max, color: "#8ab8ff", label: `control max ${formatValue(ctx.band.max, "percentunit")}` });
  }
  const opts = { ...ctx.window, unit: panel.unit, min: panel.min_value, max: panel.max_value, bands: bands(panel), lines };
  if (panel.kind === "state-timeline") {
    stateTimeline(chart, series, ctx.window, (v) => {
      const [label, name] = panel.mappings[String(v)] || [String(v), "blue"];
      return { text: label, color: color(name) };
    });
    return series.length;
  }
  lineChart(chart, series, opts);
  const legend = make("ul", "legend", body);
  for (const s of series) {
    const item = make("li", "", legend);
    make("span", "swatch", item).style.background = s.color;
    make("span", "", item, s.name);
    const last = s.points.filter(([, v]) => Number.isFinite(v)).at(-1);
    if (last) make("b", "", item, formatValue(last[1], panel.unit)).dataset.value = String(last[1]);
  }
  return series.length;
}

const DRAW = { stat: drawStat, bargauge: drawBars, table: drawTable, timeseries: drawSeries, "state-timeline": drawSeries };

// results: [{target, data}] where data is the Prometheus API's `data` object
export function drawPanel(el, panel, results, ctx) {
  const body = el.querySelector(".body");
  body.replaceChildren();
  const count = DRAW[panel.kind](panel, body, results, ctx);
  if (count) showState(el, "ok", "");
  else showState(el, "nodata", "No data: the runtime has not exported these series yet");
}

export function paintBadges(el, ruleStates) {
  for (const badge of el.querySelectorAll(".badge")) {
    const state = ruleStates[badge.dataset.alert] || "inactive";
    badge.dataset.state = state;
    badge.textContent = `${badge.dataset.alert}: ${state}`;
  }
}
