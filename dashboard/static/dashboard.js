// The built-in dashboard's pages: line and bar charts drawn into inline SVG, and the samples
// table. No libraries: the page must work on a machine with no internet, and the charts need only
// polylines, axes and a legend.
//
// After each refresh the body carries data-ready="true", data-charts (charts on the page) and
// data-charts-with-data (charts that drew at least one point or bar), data-evaluations (rows of
// the held-out evaluation table), data-warnings (the services' warnings shown) and data-state
// (running or finished); the headless-browser test reads those from the DOM.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04"];
const W = 320, H = 150, PAD = { l: 44, r: 8, t: 8, b: 20 };
const REFRESH_MS = 3000;

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:")
    ? document.createElementNS(SVG, tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(v) {
  if (!isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return (Math.round(v * 1000) / 1000).toString();
}

function fmtX(x, kind) {
  if (kind === "time") {
    const d = new Date(x * 1000);
    return d.toTimeString().slice(0, 8);
  }
  return fmt(x);
}

function niceRange(lo, hi) {
  if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; return [lo - d, hi + d]; }
  const pad = (hi - lo) * 0.05;
  return [lo - pad, hi + pad];
}

function lineChart(lines) {
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img" });
  let xs = [], ys = [];
  for (const line of lines) for (const [x, y] of line.points) { xs.push(x); ys.push(y); }
  const [x0, x1] = niceRange(Math.min(...xs), Math.max(...xs));
  const [y0, y1] = niceRange(Math.min(...ys), Math.max(...ys));
  const px = (x) => PAD.l + (x - x0) / (x1 - x0) * (W - PAD.l - PAD.r);
  const py = (y) => H - PAD.b - (y - y0) / (y1 - y0) * (H - PAD.t - PAD.b);
  for (let i = 0; i <= 4; i++) {  // horizontal grid with value labels
    const y = y0 + (y1 - y0) * i / 4;
    svg.appendChild(el("svg:line", { x1: PAD.l, x2: W - PAD.r, y1: py(y), y2: py(y), stroke: "#e5e7eb" }));
    svg.appendChild(el("svg:text", { x: PAD.l - 4, y: py(y) + 3, "text-anchor": "end" }, fmt(y)));
  }
  const kind = lines[0].x;
  svg.appendChild(el("svg:text", { x: PAD.l, y: H - 5 }, fmtX(Math.min(...xs), kind)));
  svg.appendChild(el("svg:text", { x: W - PAD.r, y: H - 5, "text-anchor": "end" },
    (kind === "time" ? "" : kind + " ") + fmtX(Math.max(...xs), kind)));
  lines.forEach((line, i) => {
    const color = COLORS[i % COLORS.length];
    const pts = line.points.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(" ");
    svg.appendChild(el("svg:polyline", {
      points: pts, fill: "none", stroke: color, "stroke-width": 1.5, "data-series": line.label,
    }));
    if (line.points.length === 1) {
      const [x, y] = line.points[0];
      svg.appendChild(el("svg:circle", { cx: px(x), cy: py(y), r: 2.5, fill: color }));
    }
  });
  return svg;
}

function barChart(bars) {
  const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img" });
  const top = Math.max(...bars.map((b) => b.value), 1);
  const bw = (W - PAD.l - PAD.r) / bars.length;
  for (let i = 0; i <= 4; i++) {
    const v = top * i / 4, y = H - PAD.b - v / top * (H - PAD.t - PAD.b);
    svg.appendChild(el("svg:line", { x1: PAD.l, x2: W - PAD.r, y1: y, y2: y, stroke: "#e5e7eb" }));
    svg.appendChild(el("svg:text", { x: PAD.l - 4, y: y + 3, "text-anchor": "end" }, fmt(v)));
  }
  const every = Math.ceil(bars.length / 10);  // label at most ~10 bars so the text stays legible
  bars.forEach((b, i) => {
    const h = b.value / top * (H - PAD.t - PAD.b);
    const x = PAD.l + i * bw;
    const rect = el("svg:rect", {
      x: x + 1, y: H - PAD.b - h, width: Math.max(bw - 2, 1), height: h, fill: COLORS[0],
    });
    rect.appendChild(el("svg:title", {}, `${b.label}: ${fmt(b.value)}`));
    svg.appendChild(rect);
    if (i % every === 0) {
      svg.appendChild(el("svg:text", { x: x + bw / 2, y: H - 5, "text-anchor": "middle" }, b.label));
    }
  });
  return svg;
}

function renderChart(chart) {
  const card = el("div", { class: "card", id: `chart-${chart.id}` });
  card.appendChild(el("h3", {}, chart.title + (chart.unit ? ` (${chart.unit})` : "")));
  const lines = (chart.lines || []).filter((l) => l.points.length > 0);
  const bars = (chart.bars || []).filter((b) => isFinite(b.value));
  let points = 0;
  if (chart.kind === "bars" && bars.length > 0) {
    card.appendChild(barChart(bars));
    points = bars.length;
  } else if (chart.kind !== "bars" && lines.length > 0) {
    card.appendChild(lineChart(lines));
    const legend = el("div", { class: "legend" });
    lines.forEach((l, i) => {
      const last = l.points[l.points.length - 1][1];
      const item = el("span", {});
      item.appendChild(el("i", { style: `background:${COLORS[i % COLORS.length]}` }));
      item.appendChild(document.createTextNode(`${l.label}: ${fmt(last)}`));
      legend.appendChild(item);
    });
    card.appendChild(legend);
    points = lines.reduce((n, l) => n + l.points.length, 0);
  } else {
    card.appendChild(el("div", { class: "empty" }, "no data yet"));
  }
  card.setAttribute("data-points", String(points));
  return card;
}

function renderEvaluations(evals) {
  // Held-out accuracy before and after RL, overall and per data source (tier or benchmark).
  const labels = Object.keys(evals);
  const box = el("div", { class: "card", id: "evaluations" });
  if (labels.length === 0) {
    box.appendChild(el("div", { class: "empty" }, "no evaluation yet"));
    return [box, 0];
  }
  const table = el("table", {});
  const head = el("tr", {});
  for (const h of ["", ...labels, ...(labels.length === 2 ? ["change"] : [])]) head.appendChild(el("th", {}, h));
  table.appendChild(head);
  const sources = new Set();
  for (const l of labels) for (const s of Object.keys(evals[l].by_data_source || {})) sources.add(s);
  const rows = [["all held-out prompts", (l) => evals[l].accuracy],
    ...[...sources].sort().map((s) => [s, (l) => (evals[l].by_data_source[s] || {}).accuracy])];
  for (const [name, get] of rows) {
    const tr = el("tr", {});
    tr.appendChild(el("td", {}, name));
    const vals = labels.map(get);
    for (const v of vals) tr.appendChild(el("td", { class: "num" }, v === undefined ? "–" : (100 * v).toFixed(1) + "%"));
    if (labels.length === 2) {
      const d = vals[1] - vals[0];
      tr.appendChild(el("td", { class: "num" }, isFinite(d) ? `${d >= 0 ? "+" : ""}${(100 * d).toFixed(1)} pts` : "–"));
    }
    table.appendChild(tr);
  }
  box.appendChild(table);
  return [box, rows.length];
}

function renderWarnings(warnings) {
  // The services' warnings a user must act on, each once, as up's console shows them.
  const box = el("div", { class: "card", id: "warnings" });
  for (const w of warnings) box.appendChild(el("div", { class: "warning" }, `${w.service}: ${w.message}`));
  return box;
}

let chosenPrompt = "";

function promptPicker(prompts, chosen) {
  const select = el("select", { id: "prompt" });
  for (const p of prompts) {
    const option = el("option", { value: p.id }, `${p.id} (${p.groups} groups) ${p.text}`);
    if (p.id === chosen) option.selected = true;
    select.appendChild(option);
  }
  select.addEventListener("change", () => { chosenPrompt = select.value; refreshCharts(); });
  const label = el("label", { class: "picker" }, "prompt of the per-prompt views: ");
  label.appendChild(select);
  return label;
}

async function refreshCharts() {
  const status = document.getElementById("status");
  try {
    const query = chosenPrompt ? `?prompt=${encodeURIComponent(chosenPrompt)}` : "";
    const r = await fetch(`/api/charts${query}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const data = await r.json();
    document.getElementById("run").textContent = `run ${data.run}`;
    const root = document.getElementById("charts");
    root.replaceChildren();
    root.appendChild(el("h2", {}, "held-out evaluation"));
    const [evalBox, evalRows] = renderEvaluations(data.evaluations || {});
    root.appendChild(evalBox);
    const warnings = data.warnings || [];
    if (warnings.length > 0) {
      root.appendChild(el("h2", {}, "warnings"));
      root.appendChild(renderWarnings(warnings));
    }
    const groups = {};
    for (const chart of data.charts) (groups[chart.group] ||= []).push(chart);
    let withData = 0;
    for (const [group, charts] of Object.entries(groups)) {
      root.appendChild(el("h2", {}, group));
      if (group === "dynamo" && (data.prompts || []).length > 0) root.appendChild(promptPicker(data.prompts, data.prompt));
      const grid = el("div", { class: "grid" });
      for (const chart of charts) {
        const card = renderChart(chart);
        if (card.getAttribute("data-points") !== "0") withData++;
        grid.appendChild(card);
      }
      root.appendChild(grid);
    }
    const s = data.sources;
    const scrape = s.scrape.map((t) => `${t.ok ? "ok  " : "DOWN"} ${t.url}${t.error ? "  " + t.error : ""}`);
    const folder = s.run_folder;
    // Only the last part of a path: the page is shared and screenshotted, the machine's layout
    // is nobody's business.
    const short = (p) => (p ? p.split("/").filter(Boolean).slice(-1)[0] : "none");
    const redis = !s.redis.configured ? "off" : s.redis.skipped ? `not read (${s.redis.skipped})`
      : s.redis.ok ? "ok" : "DOWN " + (s.redis.error || "") + (folder.sample_groups ? " (samples from the run folder)" : "");
    document.getElementById("sources").textContent =
      `metrics log: ${short(s.metrics_log.path)} (${s.metrics_log.records} records${s.metrics_log.exists ? "" : ", not found yet"})\n` +
      `run folder: ${short(folder.path)} (${folder.state}; ${folder.history_files.length} metric histories, ${folder.sample_groups} sampled groups)\n` +
      `redis: ${redis}\n` +
      (s.metrics === "run folder" ? `service metrics: run folder (${folder.history_files.join(", ")})`
        : `scrape:\n  ${scrape.join("\n  ")}`);
    const when = new Date(data.now * 1000).toTimeString().slice(0, 8);
    status.textContent = data.state === "finished" ? `run finished · read ${when}` : `updated ${when}`;
    document.body.dataset.state = data.state;
    document.body.dataset.evaluations = String(evalRows);
    document.body.dataset.warnings = String(warnings.length);
    document.body.dataset.charts = String(data.charts.length);
    document.body.dataset.chartsWithData = String(withData);
    document.body.dataset.ready = "true";
  } catch (e) {
    status.textContent = `error: ${e.message}`;
  }
}

function fillSelect(select, values) {
  const current = select.value;
  const have = new Set([...select.options].map((o) => o.value));
  for (const v of values) if (!have.has(v)) select.appendChild(el("option", { value: v }, v || "(empty)"));
  select.value = current;
}

function episodeView(row) {
  // A multi-turn episode: each model turn (trained, loss mask 1), its tool calls, and the
  // observation after it (tool output or feedback, masked: loss mask 0).
  const box = el("div", { class: "episode" });
  box.appendChild(el("div", { class: "split" },
    `episode ${row.episode}` + (row.segment ? `, forked sample ${row.segment}` : "") +
    ` · ended: ${row.end_reason || "–"} · ${row.model_tokens} model tokens (trained), ` +
    `${row.masked_tokens} observation tokens (masked)`));
  row.turns.forEach((t, k) => {
    const reward = t.reward === null ? "" : `, turn reward ${fmt(t.reward)}`;
    box.appendChild(el("div", { class: "turn model" }, `turn ${k + 1} · model, ${t.model_tokens} tokens${reward}`));
    box.appendChild(el("div", { class: "turn-text" }, t.text));
    for (const c of t.tool_calls) {
      const status = c.error ? `error: ${c.error}` : `ok, ${fmt(c.latency_s)} s`;
      box.appendChild(el("div", { class: "tool-call" + (c.error ? " failed" : "") },
        `tool call ${c.name || "(unparsed)"}(${c.arguments}) → ${status}`));
    }
    if (t.observation_tokens > 0) {
      box.appendChild(el("div", { class: "turn obs" }, `observation · masked, ${t.observation_tokens} tokens`));
      box.appendChild(el("div", { class: "turn-text obs-text" }, t.observation));
    }
  });
  return box;
}

async function refreshSamples() {
  const form = document.getElementById("filters");
  const status = document.getElementById("status");
  const params = new URLSearchParams();
  for (const [k, v] of new FormData(form)) if (k !== "live" && v !== "") params.set(k, v);
  try {
    const r = await fetch(`/api/samples?${params}`, { cache: "no-store" });
    const data = await r.json();
    if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
    document.getElementById("run").textContent = `run ${data.run}`;
    fillSelect(form.elements.source, data.sources);
    fillSelect(form.elements.reason, data.reasons);
    const body = document.getElementById("rows");
    body.replaceChildren();
    let turns = 0;
    for (const row of data.rows) {
      const tr = el("tr", { class: row.correct ? "correct" : "wrong" });
      const cells = [
        [`${row.entry_id}\n#${row.index + 1}/${row.group_size}`, "text"],
        [row.data_source, ""], [row.prompt, "text"], [row.response, "text"],
        [fmt(row.reward), "num reward"], [row.reason, ""], [String(row.allocated_n), "num"],
        [row.advantage === null ? "—" : fmt(row.advantage), "num"], [String(row.weight_version), "num"],
      ];
      for (const [text, cls] of cells) tr.appendChild(el("td", { class: cls }, text));
      if (row.turns) {
        tr.children[3].replaceChildren(episodeView(row));
        turns += row.turns.length;
      }
      body.appendChild(tr);
    }
    status.textContent = data.origin === "run folder"
      ? `${data.rows.length} rows from the run folder's sample log (${data.scanned_groups} groups); ` +
        `last weight version ${data.weight_version ?? "–"}`
      : `${data.rows.length} rows from ${data.scanned_groups} newest groups; ` +
        `stream length ${data.stream_length}; weight version ${data.weight_version ?? "–"}`;
    document.body.dataset.rows = String(data.rows.length);
    document.body.dataset.turns = String(turns);
    document.body.dataset.ready = "true";
  } catch (e) {
    status.textContent = `error: ${e.message}`;
  }
}

// The header bar both pages share: the run's name, the two pages, the status line.
function header() {
  document.querySelector("header").replaceChildren(
    el("h1", {}, "DynaMO-RL"),
    el("span", { id: "run" }),
    el("a", { href: "/" }, "charts"),
    el("a", { href: "/samples" }, "samples"),
    el("span", { class: "status", id: "status" }, "loading…"),
  );
}

function start() {
  header();
  const page = document.body.dataset.page;
  if (page === "charts") {
    refreshCharts();
    setInterval(refreshCharts, REFRESH_MS);
  } else if (page === "samples") {
    const form = document.getElementById("filters");
    // Filters travel in the page's own query string too, so a filtered view can be shared.
    const query = new URLSearchParams(location.search);
    for (const [k, v] of query) if (form.elements[k]) {
      const field = form.elements[k];
      if (field.tagName === "SELECT" && ![...field.options].some((o) => o.value === v)) {
        field.appendChild(el("option", { value: v }, v));
      }
      field.value = v;
    }
    form.addEventListener("change", refreshSamples);
    form.addEventListener("submit", (e) => { e.preventDefault(); refreshSamples(); });
    refreshSamples();
    setInterval(() => { if (form.elements.live.checked) refreshSamples(); }, REFRESH_MS);
  }
}

start();
