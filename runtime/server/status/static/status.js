// The status page's loop: load the dashboards' panel catalogue once, then every few seconds
// fetch the summary and every panel's PromQL through /api/v1/query(_range), and redraw.
// `?refresh=SECONDS` sets the period (default 5, at least 0.5).
// Part of fastllm-stack (Apache-2.0); no dependencies.

import { renderFacts } from "./facts.js";
import { clockTime } from "./format.js";
import { drawPanel, paintBadges, panelShell, showState } from "./panels.js";

const params = new URLSearchParams(window.location.search);
const REFRESH_S = Math.max(0.5, Number(params.get("refresh")) || 5);
const TOKEN_KEY = "fastllm-status-token";
const INSTANT_KINDS = new Set(["stat", "bargauge", "table"]);
const CONCURRENCY = 4;
// generation: a new token restarts the loops; a step of an older generation stops itself
const page = { catalog: null, shells: new Map(), offset: 0, timers: [], generation: 0, band: null, ruleStates: {} };

class AuthNeeded extends Error {}

function authHeaders() {
  const token = window.sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function getJSON(path, query) {
  const url = query ? `${path}?${new URLSearchParams(query)}` : path;
  const response = await fetch(url, { headers: authHeaders(), cache: "no-store" });
  if (response.status === 401) throw new AuthNeeded("this server needs an API key");
  const body = await response.json();
  if (!response.ok) throw new Error(typeof body.error === "string" ? body.error : body.error?.message);
  return body;
}

function setStatus(text, isError = false) {
  const el = document.getElementById("refresh-state");
  el.textContent = text;
  el.classList.toggle("warn", isError);
}

function buildSections(catalog) {
  const root = document.getElementById("dashboards");
  const nav = document.getElementById("dashboard-nav");
  root.replaceChildren();
  nav.replaceChildren();
  page.shells.clear();
  for (const board of catalog.dashboards) {
    const section = document.createElement("section");
    section.className = "dashboard";
    section.id = `dashboard-${board.name}`;
    const title = document.createElement("h2");
    title.textContent = board.title;
    const grid = document.createElement("div");
    grid.className = "grid";
    section.append(title, grid);
    root.appendChild(section);
    const link = document.createElement("a");
    link.href = `#${section.id}`;
    link.textContent = board.title.replace(/^fastllm \/ /, "");
    nav.appendChild(link);
    for (const panel of catalog.panels.filter((p) => p.dashboard === board.name)) {
      const el = panelShell(panel);
      grid.appendChild(el);
      page.shells.set(panel.key, el);
      if (panel.problem) showState(el, "unsupported", `Not drawn: ${panel.problem}`);
      else if (panel.note) showState(el, "sql", panel.note);
      else if (!catalog.store.available) showState(el, "error", catalog.store.reason);
    }
  }
}

function queryFor(panel, target, win) {
  if (target.instant || INSTANT_KINDS.has(panel.kind)) {
    return getJSON("/api/v1/query", { query: target.expr, time: win.end });
  }
  return getJSON("/api/v1/query_range", { query: target.expr, start: win.start, end: win.end, step: win.step });
}

async function drawOne(panel, win, ctx) {
  const el = page.shells.get(panel.key);
  try {
    const answers = await Promise.all(panel.targets.map((t) => queryFor(panel, t, win)));
    const results = answers.map((a, i) => ({ target: panel.targets[i], data: a.data }));
    drawPanel(el, panel, results, ctx);
  } catch (err) {
    if (err instanceof AuthNeeded) throw err;
    showState(el, "error", `Query failed: ${err.message}`);
  }
}

async function drawPanels(ctx) {
  const { window: w } = page.catalog;
  const now = Date.now() / 1000 + page.offset;
  const end = Math.floor(now / w.step_s) * w.step_s; // aligned, as Grafana does
  const win = { start: end - w.range_s, end, step: w.step_s };
  ctx.window = win;
  const todo = page.catalog.panels.filter((p) => !p.problem && !p.note && page.catalog.store.available);
  const workers = Array.from({ length: CONCURRENCY }, async () => {
    while (todo.length) await drawOne(todo.shift(), win, ctx);
  });
  await Promise.all(workers);
}

function controlBand(server) {
  const v = server.versions.find((x) => x.min_util !== null);
  return v ? { min: v.min_util, max: v.max_util } : null;
}

// Two loops, each rescheduling itself when done: the facts (alert states, audit) stay fresh
// even while a slow machine takes longer to redraw every panel.
async function refreshFacts() {
  const auditAll = new URLSearchParams(location.search).get("audit") === "all";
  const summary = await getJSON(`/status/api/summary${auditAll ? "?audit=all" : ""}`);
  page.offset = summary.server.now - Date.now() / 1000;
  page.band = controlBand(summary.server);
  page.ruleStates = Object.fromEntries(summary.alerts.rules.map((r) => [r.name, r.state]));
  renderFacts(summary);
  for (const el of page.shells.values()) paintBadges(el, page.ruleStates);
  document.getElementById("viewer").textContent = summary.is_admin ? "admin: owner details shown" : "";
  setStatus(`updated ${clockTime(summary.server.now)} UTC · every ${REFRESH_S} s`);
  document.body.dataset.facts = String((Number(document.body.dataset.facts) || 0) + 1);
}

async function refreshPanels() {
  if (!page.catalog) {
    page.catalog = await getJSON("/status/api/panels");
    buildSections(page.catalog);
    for (const el of page.shells.values()) paintBadges(el, page.ruleStates);
  }
  await drawPanels({ band: page.band });
  document.body.dataset.refreshed = String((Number(document.body.dataset.refreshed) || 0) + 1);
}

function loop(step) {
  const generation = page.generation;
  const run = async () => {
    try {
      await step();
    } catch (err) {
      if (generation !== page.generation) return;
      if (err instanceof AuthNeeded) {
        setStatus("This server requires an API key (or the admin token): enter it above.", true);
        return; // no polling until a key is given: every refused request is a console error
      }
      setStatus(`refresh failed: ${err.message}`, true);
    }
    if (generation === page.generation) page.timers.push(window.setTimeout(run, REFRESH_S * 1000));
  };
  run();
}

function start() {
  for (const timer of page.timers) window.clearTimeout(timer);
  page.timers = [];
  page.generation += 1;
  page.catalog = null;
  loop(refreshFacts);
  loop(refreshPanels);
}

function useToken() {
  const value = document.getElementById("token").value.trim();
  if (value) window.sessionStorage.setItem(TOKEN_KEY, value);
  else window.sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token").value = "";
  start();
}

document.getElementById("auth").addEventListener("submit", (e) => {
  e.preventDefault(); // nothing is posted anywhere: the token stays in this tab's sessionStorage
  useToken();
});
start();
