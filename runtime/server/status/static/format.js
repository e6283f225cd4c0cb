// Number, unit, time and legend formatting for the status page (Grafana's unit names).
// Part of fastllm-stack (Apache-2.0); no dependencies.

const SI = [
  [1e12, "T"],
  [1e9, "G"],
  [1e6, "M"],
  [1e3, "K"],
];
const BINARY = [
  [2 ** 40, "TiB"],
  [2 ** 30, "GiB"],
  [2 ** 20, "MiB"],
  [2 ** 10, "KiB"],
];

// Grafana's palette names -> colours readable on the page's dark background
export const COLORS = {
  green: "#56a64b",
  "dark-green": "#37872d",
  red: "#e02f44",
  orange: "#ff9830",
  yellow: "#f2cc0c",
  blue: "#3274d9",
  purple: "#a352cc",
  text: "#d8d9da",
};
const SERIES = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"];

export function color(name) {
  return COLORS[name] || name || COLORS.text;
}

export function seriesColor(i) {
  return SERIES[i % SERIES.length];
}

function trimmed(v, digits) {
  return Number(v.toFixed(digits)).toString();
}

function scaled(v, table, unitless) {
  const abs = Math.abs(v);
  for (const [size, suffix] of table) {
    if (abs >= size) return `${trimmed(v / size, 2)} ${suffix}`;
  }
  return unitless(v);
}

function plain(v) {
  if (Number.isInteger(v)) return v.toString();
  const abs = Math.abs(v);
  return trimmed(v, abs >= 100 ? 1 : abs >= 1 ? 2 : 3);
}

function seconds(v) {
  const abs = Math.abs(v);
  if (abs === 0) return "0 s";
  if (abs < 1e-3) return `${trimmed(v * 1e6, 1)} µs`;
  if (abs < 1) return `${trimmed(v * 1e3, 1)} ms`;
  return `${trimmed(v, 2)} s`;
}

// `v` a number (or "NaN"/"+Inf" strings from the API); `unit` a Grafana unit id
export function formatValue(v, unit) {
  const n = typeof v === "number" ? v : Number(v);
  if (Number.isNaN(n)) return "NaN";
  if (!Number.isFinite(n)) return n > 0 ? "+Inf" : "-Inf";
  switch (unit) {
    case "percentunit":
      return `${trimmed(n * 100, 1)}%`;
    case "bytes":
      return scaled(n, BINARY, (x) => `${plain(x)} B`);
    case "s":
      return seconds(n);
    case "reqps":
      return `${scaled(n, SI, plain)} req/s`;
    case "ops":
      return `${scaled(n, SI, plain)} ops/s`;
    default:
      return Math.abs(n) >= 1e6 ? scaled(n, SI, plain) : plain(n);
  }
}

// Grafana legendFormat: `{{label}}` replaced by the series' label values
export function legendName(format, metric) {
  if (format) return format.replace(/\{\{\s*(\w+)\s*\}\}/g, (_, k) => metric[k] ?? "");
  const name = metric.__name__ || "";
  const labels = Object.entries(metric)
    .filter(([k]) => k !== "__name__")
    .map(([k, v]) => `${k}="${v}"`);
  return labels.length ? `${name}{${labels.join(", ")}}` : name || "value";
}

export function formatDuration(s) {
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${trimmed(s, 1)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${trimmed(s / 3600, 1)} h`;
  return `${trimmed(s / 86400, 1)} d`;
}

export function clockTime(t) {
  return new Date(t * 1000).toISOString().slice(11, 19);
}
