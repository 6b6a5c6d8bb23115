// Draws the panels bench/render_panels.py hands over (already queried from Prometheus / the Loki sink),
// laid out on Grafana's 24-column grid and styled like its dark theme. Time series are drawn by uPlot,
// the library Grafana's time-series panel draws with. No data is computed here beyond stacking.
"use strict";

const COLS = 24, ROW = 30, GUTTER = 8, HEADER = 64, FOOTER = 24;
// Grafana's classic palette (palette-classic), dark theme values, in order.
const PALETTE = ["#73BF69", "#E0B400", "#8AB8FF", "#FA6400", "#F2495C", "#5794F2", "#B877D9", "#705DA0",
                 "#37872D", "#FADE2A", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477"];
const GREEN = "#73BF69", RED = "#F2495C", TEXT = "rgba(204,204,220,0.75)", GRID = "rgba(240,250,255,0.09)";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function decimals(v, size) {
  if (v === 0) return 0;
  const a = Math.abs(v) / size;
  return a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : Math.min(6, 1 - Math.floor(Math.log10(a)));
}

function trim(s) {
  return s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
}

function scaled(v, steps, base) {
  let i = 0;
  while (i < steps.length - 1 && Math.abs(v) >= base) { v /= base; i++; }
  return trim(v.toFixed(decimals(v, 1))) + steps[i];
}

// Grafana's value formats for the units the dashboards use.
function fmt(unit, v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "";
  switch (unit) {
    case "percentunit": return trim((v * 100).toFixed(decimals(v * 100, 1))) + "%";
    case "Bps": return scaled(v, [" B/s", " kB/s", " MB/s", " GB/s"], 1000);
    case "s":
      if (v === 0) return "0 s";
      if (Math.abs(v) < 1) return trim((v * 1000).toFixed(decimals(v * 1000, 1))) + " ms";
      if (Math.abs(v) < 60) return trim(v.toFixed(decimals(v, 1))) + " s";
      return trim((v / 60).toFixed(1)) + " min";
    default: return scaled(v, ["", " K", " Mil", " Bil"], 1000);
  }
}

function thresholdColor(v) { return v >= 80 ? RED : GREEN; }  // Grafana's default thresholds: base green, 80 red

function panelBox(root, p) {
  const colW = (root.clientWidth - GUTTER) / COLS;
  const box = el("div", "panel");
  box.style.left = (GUTTER + p.grid.x * colW) + "px";
  box.style.top = (HEADER + p.grid.y * (ROW + GUTTER)) + "px";
  box.style.width = (p.grid.w * colW - GUTTER) + "px";
  box.style.height = (p.grid.h * ROW + (p.grid.h - 1) * GUTTER) + "px";
  box.appendChild(el("div", "ptitle", p.title));
  const body = el("div", "body");
  box.appendChild(body);
  root.appendChild(box);
  return [box, body];
}

function noData(body) { body.appendChild(el("div", "nodata", "No data")); }

function drawStat(box, body, p) {
  const mode = p.options.colorMode;
  if (!p.series.length) return noData(body);
  const wrap = el("div", "stat");
  const size = Math.min(44, Math.max(22, (body.clientHeight - 10) * 0.55));
  for (const s of p.series) {
    const one = el("div", "one");
    if (p.series.length > 1) one.appendChild(el("div", "name", s.name));
    const value = el("div", "value", fmt(p.unit, s.value));
    value.style.fontSize = (p.series.length > 1 ? size * 0.8 : size) + "px";
    if (mode === "value") value.style.color = thresholdColor(s.value);
    one.appendChild(value);
    wrap.appendChild(one);
  }
  if (mode === "background") box.classList.add(thresholdColor(p.series[0].value) === RED ? "bg-red" : "bg-green");
  body.appendChild(wrap);
}

function drawBarGauge(box, body, p) {
  if (!p.series.length) return noData(body);
  const rows = [...p.series].sort((a, b) => b.value - a.value);
  const max = Math.max(...rows.map(s => s.value));
  const wrap = el("div", "bars");
  for (const s of rows) {
    const row = el("div", "row");
    row.appendChild(el("div", "name", s.name));
    const track = el("div", "track"), fill = el("div", "fill");
    fill.style.width = (max > 0 ? 100 * s.value / max : 0) + "%";
    fill.style.background = `linear-gradient(90deg, rgba(115,191,105,0.25), ${thresholdColor(s.value)})`;
    track.appendChild(fill);
    row.appendChild(track);
    const num = el("div", "num", fmt(p.unit, s.value));
    num.style.color = thresholdColor(s.value);
    row.appendChild(num);
    wrap.appendChild(row);
  }
  body.appendChild(wrap);
}

function drawTable(box, body, p) {
  if (!p.table || !p.table.rows.length) return noData(body);
  const t = el("table"), head = el("tr");
  for (const c of p.table.columns) head.appendChild(el("th", "", c));
  t.appendChild(head);
  for (const r of p.table.rows) {
    const tr = el("tr");
    r.forEach((v, i) => {
      const td = el("td", "", v);
      if (p.table.columns[i] === "outcome") td.style.color = v === "attributed" ? GREEN : v === "unattributed" ? "#FF9830" : "";
      tr.appendChild(td);
    });
    t.appendChild(tr);
  }
  // Narrow columns for short values, the rest of the width to the long ones (Grafana sizes by content).
  const widths = p.table.columns.map((c, i) => 4 + Math.min(44, Math.max(c.length, ...p.table.rows.map(r => (r[i] || "").length))));
  const total = widths.reduce((a, b) => a + b, 0);
  const cols = el("colgroup");
  for (const w of widths) { const col = el("col"); col.style.width = (100 * w / total) + "%"; cols.appendChild(col); }
  t.insertBefore(cols, t.firstChild);
  body.appendChild(t);
}

function drawLogs(box, body, p) {
  if (!p.logs.length) return noData(body);
  const wrap = el("div", "logs");
  for (const l of p.logs) {
    const line = el("div", "line " + (l.role || ""));
    if (p.options.showTime) line.appendChild(el("span", "time", l.time));
    let msg = l.line;
    if (p.options.prettifyLogMessage) {
      try { msg = JSON.stringify(JSON.parse(msg), null, 2); } catch (e) { /* not JSON: as is */ }
    }
    line.appendChild(el("span", "msg", msg));
    wrap.appendChild(line);
  }
  body.appendChild(wrap);
}

function alpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16},${(n >> 8) & 255},${n & 255},${a})`;
}

function drawTimeseries(box, body, p) {
  const custom = p.custom || {}, legendOpts = (p.options || {}).legend || {};
  box.querySelector(".ptitle").appendChild(el("span", "interval", p.interval));
  if (!p.series.length) return noData(body);
  const stacked = custom.stacking && custom.stacking.mode === "normal";
  const series = p.series.map((s, i) => ({ ...s, color: PALETTE[i % PALETTE.length] }));
  // Stacking: each series is drawn at the running sum; bars are painted top of the stack first.
  let ys = series.map(s => s.y);
  if (stacked) {
    const acc = p.x.map(() => 0);
    ys = series.map(s => s.y.map((v, j) => (acc[j] += (v || 0))));
  }
  const order = stacked ? series.map((_, i) => series.length - 1 - i) : series.map((_, i) => i);
  const right = legendOpts.placement === "right";
  const legend = right ? el("div", "legend-table") : el("div", "legend");
  const plot = el("div");
  const row = el("div");
  row.style.display = "flex";
  row.style.flexDirection = right ? "row" : "column";
  row.style.height = "100%";
  row.appendChild(plot);
  row.appendChild(legend);
  body.appendChild(row);
  // Legend: Grafana's list (bottom) or table (right) with the panel's calcs (here: sum).
  const calcs = legendOpts.calcs || [];
  if (right) {
    const t = el("table"), h = el("tr");
    h.appendChild(el("th", "", ""));
    for (const c of calcs) h.appendChild(el("th", "", c[0].toUpperCase() + c.slice(1)));
    t.appendChild(h);
    for (const s of series) {
      const tr = el("tr"), name = el("td");
      const sw = el("span", "swatch");
      sw.style.cssText = `display:inline-block;width:14px;height:4px;border-radius:2px;margin-right:6px;vertical-align:middle;background:${s.color}`;
      name.appendChild(sw);
      name.appendChild(document.createTextNode(s.name));
      name.style.textAlign = "left";
      tr.appendChild(name);
      for (const c of calcs) {
        const vals = s.y.filter(v => v !== null);
        const v = c === "sum" ? vals.reduce((a, b) => a + b, 0) : c === "max" ? Math.max(...vals) : vals[vals.length - 1];
        const td = el("td", "", fmt(p.unit, v));
        td.style.textAlign = "right";
        tr.appendChild(td);
      }
      t.appendChild(tr);
    }
    legend.appendChild(t);
    legend.style.width = "290px";
    legend.style.flex = "none";
    legend.style.overflow = "hidden";
  } else {
    for (const s of series) {
      const item = el("div", "item"), sw = el("span", "swatch");
      sw.style.background = s.color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(s.name));
      legend.appendChild(item);
    }
  }
  const width = body.clientWidth - 16 - (right ? 290 : 0);
  const height = body.clientHeight - (right ? 0 : legend.offsetHeight + 2);
  const draw = custom.drawStyle || "line";
  const uSeries = [{}];
  const data = [p.x];
  for (const i of order) {
    const s = series[i];
    const cfg = { label: s.name, stroke: s.color, width: custom.lineWidth || 1, spanGaps: false,
                  points: { show: draw === "points", size: custom.pointSize || 5, fill: s.color } };
    if (draw === "bars") {
      cfg.paths = uPlot.paths.bars({ size: [0.9, 64], align: 0 });
      cfg.fill = alpha(s.color, (custom.fillOpacity || 80) / 100);
      cfg.width = 0;
    } else if (draw === "points") {
      cfg.paths = () => null;
    } else if (custom.fillOpacity) {
      cfg.fill = alpha(s.color, custom.fillOpacity / 100);
    }
    uSeries.push(cfg);
    data.push(ys[i]);
  }
  const axis = { stroke: TEXT, grid: { stroke: GRID, width: 1 }, ticks: { show: false },
                 font: "12px 'Liberation Sans', Arial, sans-serif" };
  const anns = p.annotations || [];
  const opts = {
    width, height, series: uSeries, legend: { show: false }, cursor: { show: false },
    tzDate: ts => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
    scales: { x: { time: true, min: p.from, max: p.to },
              y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.08 : 1] } },
    axes: [{ ...axis, space: 80, values: (u, splits) => splits.map(clock) },
           { ...axis, size: 64, values: (u, vals) => vals.map(v => fmt(p.unit, v)) }],
    hooks: { draw: [u => {
      // Annotations as Grafana draws them: a dashed vertical line and a marker on the x axis, and here
      // (a picture cannot be hovered) the annotation's title next to it.
      const ctx = u.ctx;
      for (const a of anns) {
        const x = Math.round(u.valToPos(a.time, "x", true));
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
        ctx.save();
        ctx.strokeStyle = RED; ctx.fillStyle = RED; ctx.lineWidth = 1; ctx.setLineDash([4, 4]);
        ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
        ctx.setLineDash([]);
        const yb = u.bbox.top + u.bbox.height;
        ctx.beginPath(); ctx.moveTo(x - 5, yb + 7); ctx.lineTo(x + 5, yb + 7); ctx.lineTo(x, yb); ctx.fill();
        ctx.font = "12px 'Liberation Sans', Arial, sans-serif";
        ctx.textAlign = "left"; ctx.textBaseline = "alphabetic";
        const label = a.name + ": " + a.title;
        const w = ctx.measureText(label).width;
        const lx = x + 6 + w > u.bbox.left + u.bbox.width ? x - 6 - w : x + 6;
        ctx.fillStyle = "rgba(24,27,31,0.85)"; ctx.fillRect(lx - 3, u.bbox.top + 2, w + 6, 17);
        ctx.fillStyle = "#ff7383"; ctx.fillText(label, lx, u.bbox.top + 15);
        ctx.restore();
      }
    }] },
  };
  new uPlot(opts, data, plot);
}

// Grafana's time axis: HH:mm, and MM/DD at midnight (UTC here).
function clock(ts) {
  const d = new Date(ts * 1000), two = n => String(n).padStart(2, "0");
  if (d.getUTCHours() === 0 && d.getUTCMinutes() === 0) return two(d.getUTCMonth() + 1) + "/" + two(d.getUTCDate());
  return two(d.getUTCHours()) + ":" + two(d.getUTCMinutes());
}

function drawDashboard(spec) {
  const root = document.getElementById("dashboard");
  root.style.width = spec.width + "px";
  const rows = Math.max(...spec.panels.map(p => p.grid.y + p.grid.h));
  root.style.height = (HEADER + rows * (ROW + GUTTER) + FOOTER) + "px";
  const header = el("div", "header");
  header.appendChild(el("div", "title", spec.title));
  const hours = Math.round((spec.to - spec.from) / 3600);
  const range = el("div", "chip", `Last ${hours} hours · UTC`);
  header.appendChild(range);
  for (const [k, v] of Object.entries(spec.variables)) {
    if (["datasource", "loki", "job"].includes(k) || v === "" ) continue;
    const chip = el("div", "chip");
    chip.appendChild(el("b", "", k));
    chip.appendChild(document.createTextNode(v === ".*" ? "All" : v.replace(/\\/g, "")));
    header.appendChild(chip);
  }
  root.appendChild(header);
  const note = el("div", "note", "Not Grafana: drawn by bench/render_panels.py with uPlot in headless Chromium from the "
    + "dashboard JSON's own queries, run by a real Prometheus fed by hypocenter's /metrics (a simulated day); "
    + "Loki panels from the entries hypocenter pushed.");
  note.style.top = (HEADER + rows * (ROW + GUTTER)) + "px";
  root.appendChild(note);
  const draw = { stat: drawStat, bargauge: drawBarGauge, table: drawTable, logs: drawLogs, timeseries: drawTimeseries };
  for (const p of spec.panels) {
    const [box, body] = panelBox(root, p);
    draw[p.type](box, body, p);
  }
  document.body.dataset.drawn = "yes";
}
