// The status page's cards that are not dashboard panels: what is served, alert states, the
// operator-anomaly audit and memory holders, from /status/api/summary.
// Part of fastllm-stack (Apache-2.0); no dependencies.

import { clockTime, formatDuration, formatValue } from "./format.js";

const NUM_CHANGES = 10;

function make(tag, className, parent, content) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (content !== undefined) node.textContent = content;
  if (parent) parent.appendChild(node);
  return node;
}

function table(parent, columns) {
  const t = make("table", "", parent);
  const head = make("tr", "", make("thead", "", t));
  for (const c of columns) make("th", "", head, c);
  return make("tbody", "", t);
}

function row(body, cells) {
  const tr = make("tr", "", body);
  for (const c of cells) make("td", typeof c === "number" ? "num" : "", tr, String(c));
  return tr;
}

function renderServed(box, server, alerts) {
  box.replaceChildren();
  for (const v of server.versions) {
    const item = make("span", "fact", box);
    item.dataset.model = v.model;
    item.dataset.version = v.version;
    make("b", "", item, `${v.model} / ${v.version}`);
    const share = `${Math.round(v.canary_weight * 100)}% of traffic`;
    const limit = v.batch_size_limit === null ? "loading" : `batch limit ${v.batch_size_limit}`;
    const band = v.min_util === null ? "" : `, control band ${Math.round(v.min_util * 100)}–${Math.round(v.max_util * 100)}%`;
    make("span", "", item, ` ${share}, ${limit}${band}`);
    if (v.kv_leaked_pages !== null && v.kv_leaked_pages !== undefined) {
      // the idle self-check: every KV page free or cached, every allocator block owned
      const leaks = v.kv_leaked_pages + v.allocator_orphan_blocks;
      const text = leaks === 0 ? ", self-check clean"
        : `, self-check: ${v.kv_leaked_pages} KV pages leaked, ${v.allocator_orphan_blocks} orphan blocks`;
      make("span", leaks === 0 ? "" : "warn", item, text);
    }
    if (v.lora_registered) {
      // LoRA adapters served on this version: how many, and which hold resident weights now
      const resident = v.lora_resident.length ? v.lora_resident.join(", ") : "none";
      make("span", "", item, `, LoRA adapters ${v.lora_registered.length} (resident: ${resident})`);
    }
  }
  make("span", "fact", box, `device ${server.device}`);
  make("span", "fact", box, `up ${formatDuration(server.uptime_s)}`);
  make("span", "fact", box, `fastllm-stack ${server.package_version}`);
  if (alerts.time_scale !== 1) make("span", "fact warn", box, `alert time scale ×${alerts.time_scale}`);
  if (!server.is_ready) make("span", "fact warn", box, server.load_error || "model loading");
}

function safeUrl(url) {
  return /^https?:\/\//.test(url) ? url : "";
}

function renderAlerts(box, alerts, now) {
  box.replaceChildren();
  if (!alerts.enabled) {
    make("p", "muted", box, "The embedded alert evaluator is off (alerts_enabled=false).");
    return;
  }
  const active = alerts.rules.flatMap((r) => r.alerts.map((a) => ({ rule: r, alert: a })));
  active.sort((a, b) => (a.alert.state === b.alert.state ? 0 : a.alert.state === "firing" ? -1 : 1));
  if (!active.length) {
    make("p", "muted", box, `None pending or firing (${alerts.rules.length} rules evaluated).`);
  }
  const list = make("ul", "alerts", box);
  for (const { rule, alert } of active) {
    const item = make("li", "alert", list);
    item.dataset.alert = rule.name;
    item.dataset.state = alert.state;
    make("span", "chip", item, alert.state);
    make("b", "", item, rule.name);
    const since = alert.state === "firing" ? alert.fired_at : alert.active_at;
    make("span", "muted", item, ` ${rule.severity} · ${alert.state} for ${formatDuration(Math.max(0, now - since))}`);
    make("p", "", item, alert.summary);
    const url = safeUrl(alert.runbook_url);
    if (url) {
      const link = make("a", "", item, "runbook");
      link.href = url;
      link.rel = "noreferrer";
    }
  }
  if (!alerts.changes.length) return;
  make("h3", "", box, "Recent changes (newest first)");
  const changes = make("ul", "changes", box);
  for (const c of alerts.changes.slice(-NUM_CHANGES).reverse()) {
    const item = make("li", "", changes);
    item.dataset.alert = c.alertname;
    item.dataset.state = c.state;
    item.dataset.ts = String(c.ts);
    const where = Object.entries(c.labels)
      .filter(([k]) => !["alertname", "severity", "job", "instance"].includes(k))
      .map(([k, v]) => `${k}=${v}`)
      .join(" ");
    item.textContent = `${clockTime(c.ts)} ${c.alertname} ${where} → ${c.state}`;
  }
}

function renderAudit(box, audit, isAdmin) {
  box.replaceChildren();
  if (!audit.available) {
    make("p", "muted", box, audit.reason);
    return;
  }
  const scope = audit.models.length ? `${audit.models.join(", ")} on ${audit.instance}` : "every server";
  make("p", "muted", box, `${scope}: |output − expected| > each row's tolerance (base ${audit.threshold}) since ${audit.since.slice(11, 19)} UTC: ${audit.num_anomalies} anomalies`);
  const toggle = make("a", "muted", box, audit.models.length ? "show every server's rows" : "show this server's rows");
  toggle.href = audit.models.length ? "?audit=all" : "?";
  const body = table(box, ["op", "verified", "anomalies", "max |error|"]);
  for (const op of audit.per_op) {
    const worst = op.max_abs_error === null ? "" : formatValue(op.max_abs_error, "short");
    const tr = row(body, [op.op, op.num_verified, op.num_anomalies, worst]);
    tr.dataset.op = op.op;
    tr.dataset.anomalies = String(op.num_anomalies);
    if (op.num_anomalies > 0) tr.className = "bad";
  }
  if (!audit.per_op.length) make("p", "muted", box, "No verified results in this window yet.");
  if (!isAdmin) return;
  const worst = table(box, ["request", "op", "|error|"]);
  for (const r of audit.worst) row(worst, [r.request_id, r.op, formatValue(r.abs_error, "short")]);
}

function renderMemory(box, server, isAdmin) {
  box.replaceChildren();
  for (const m of server.memory) {
    make("p", "", box, `${m.device}: ${formatValue(m.bytes_in_use, "bytes")} in use, ${formatValue(m.bytes_cached, "bytes")} cached, ${m.live_blocks} live blocks`);
    if (!m.owners) continue;
    const body = table(box, ["owner", "blocks", "bytes", "oldest"]);
    for (const o of m.owners) {
      const tr = row(body, [o.owner, o.num_blocks, formatValue(o.reserved_bytes, "bytes"), formatDuration(o.oldest_age_s)]);
      tr.dataset.owner = o.owner;
    }
  }
  for (const v of server.versions) {
    // a model split over tensor-parallel ranks: each rank's process, KV pool and weights
    if (!v.tp_ranks) continue;
    make("p", "", box, `${v.model} / ${v.version}: ${v.tp_ranks.length} tensor-parallel ranks`);
    const body = table(box, ["rank", "process", "resident", "KV pool", "weights"]);
    for (const r of v.tp_ranks) {
      const rss = r.rss_bytes === null ? "—" : formatValue(r.rss_bytes, "bytes");
      const tr = row(body, [r.rank, r.alive ? "alive" : "dead", rss, formatValue(r.kv_pool_bytes, "bytes"), formatValue(r.weight_bytes, "bytes")]);
      tr.dataset.rank = String(r.rank);
      if (!r.alive) tr.className = "bad";
    }
  }
  if (!server.memory.length) make("p", "muted", box, "The model is not loaded yet.");
  if (!isAdmin) make("p", "muted", box, "Totals only: who holds memory (request ids) needs the admin token.");
}

export function renderFacts(summary) {
  const { server, alerts, audit } = summary;
  renderServed(document.getElementById("served"), server, alerts);
  renderAlerts(document.getElementById("alerts"), alerts, server.now);
  renderAudit(document.getElementById("audit"), audit, summary.is_admin);
  renderMemory(document.getElementById("memory"), server, summary.is_admin);
}
