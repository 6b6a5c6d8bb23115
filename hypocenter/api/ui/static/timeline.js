// The timeline across nodes: one lane per node, each evidence line placed in time, the root cause
// and the symptoms drawn apart, and the first root-cause event marked: where the failure began.
const NS = "http://www.w3.org/2000/svg";
const LANE = 30;
const LEFT = 150;
const RIGHT = 24;
const TOP = 34;
const WIDTH = 1200;
const JOB_LANE = "(job)";

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

const hms = (ms) => new Date(ms).toISOString().slice(11, 19);

function ticks(t0, t1) {
  const span = t1 - t0;
  const steps = [1e3, 2e3, 5e3, 10e3, 15e3, 30e3, 60e3, 120e3, 300e3, 600e3, 900e3, 1800e3, 3600e3, 7200e3, 21600e3];
  const step = steps.find((x) => span / x <= 8) || 43200e3;
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) out.push(t);
  return out;
}

// The lanes: culprit nodes first (where it began), then other nodes with evidence, then the job's own logs.
function lanes(diagnosis, events) {
  const culprits = diagnosis.root_cause?.nodes || [];
  const withEvents = new Set(events.map((e) => e.lane));
  const ordered = [...culprits, ...(diagnosis.attempt?.nodes || []), ...[...withEvents].sort()];
  const out = [];
  for (const n of ordered) if (withEvents.has(n) && !out.includes(n)) out.push(n);
  for (const n of culprits) if (!out.includes(n)) out.unshift(n);
  return out.sort((a, b) => (a === JOB_LANE) - (b === JOB_LANE));
}

export function drawTimeline(diagnosis) {
  const events = (diagnosis.evidence || [])
    .filter((e) => e.time)
    .map((e) => ({ ...e, ms: Date.parse(e.time), lane: e.node || JOB_LANE }))
    .filter((e) => !Number.isNaN(e.ms));
  const figure = document.createElement("figure");
  figure.className = "timeline";
  if (!events.length) {
    figure.append(Object.assign(document.createElement("p"), { className: "empty", textContent: "No timed evidence to place on a timeline." }));
    return figure;
  }
  const rows = lanes(diagnosis, events);
  const causes = events.filter((e) => e.role === "root_cause").sort((a, b) => a.ms - b.ms);
  // The marked event is the one the verdict dates the root cause by (root_cause.first_seen, on a
  // culprit node), so the picture and the verdict card agree; an earlier root-cause line elsewhere
  // (a rank's own report, under another clock) stays on its lane unmarked.
  const culpritSet = new Set(diagnosis.root_cause?.nodes || []);
  const dated = Date.parse(diagnosis.root_cause?.first_seen || "");
  const onCulprits = causes.filter((e) => culpritSet.has(e.lane));
  const first = Number.isNaN(dated) || !onCulprits.length ? causes[0] || null
    : onCulprits.reduce((best, e) => (Math.abs(e.ms - dated) < Math.abs(best.ms - dated) ? e : best));
  let t0 = Math.min(...events.map((e) => e.ms));
  let t1 = Math.max(...events.map((e) => e.ms));
  if (t1 - t0 < 2000) { t0 -= 1000; t1 += 1000; }
  const pad = (t1 - t0) * 0.04;
  t0 -= pad; t1 += pad;
  const height = TOP + rows.length * LANE + 14;
  const x = (ms) => LEFT + ((ms - t0) / (t1 - t0)) * (WIDTH - LEFT - RIGHT);
  const y = (lane) => TOP + rows.indexOf(lane) * LANE + LANE / 2;
  const culprits = culpritSet;

  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, role: "img", "aria-labelledby": "tl-title tl-desc",
    class: "timeline-svg", preserveAspectRatio: "xMinYMin meet" });
  svg.append(s("title", { id: "tl-title" }, "Timeline of the evidence across nodes"));
  svg.append(s("desc", { id: "tl-desc" }, first
    ? `The root cause first appears on ${first.lane} at ${hms(first.ms)} UTC (${first.rule}); ${events.length - causes.length} symptom and context events follow on ${rows.length} lanes.`
    : `${events.length} events on ${rows.length} lanes; no root-cause event.`));

  rows.forEach((lane, i) => {
    const top = TOP + i * LANE;
    svg.append(s("rect", { x: 0, y: top, width: WIDTH, height: LANE, class: culprits.has(lane) ? "lane culprit" : i % 2 ? "lane odd" : "lane" }));
    svg.append(s("text", { x: 10, y: top + LANE / 2 + 5, class: culprits.has(lane) ? "lane-label culprit" : "lane-label" }, lane));
  });
  for (const t of ticks(t0, t1)) {
    svg.append(s("line", { x1: x(t), x2: x(t), y1: TOP - 6, y2: height - 14, class: "tick" }));
    svg.append(s("text", { x: x(t), y: TOP - 12, class: "tick-label", "text-anchor": "middle" }, hms(t)));
  }
  // context first, then symptoms, then causes on top
  const order = { context: 0, symptom: 1, root_cause: 2 };
  for (const e of [...events].sort((a, b) => (order[a.role] ?? 0) - (order[b.role] ?? 0))) {
    const cx = x(e.ms);
    const cy = y(e.lane);
    const tip = s("title", {}, `${e.time} ${e.lane} ${e.role}: ${e.text}`);
    if (e.role === "root_cause") {
      svg.append(s("path", { d: `M${cx} ${cy - 8} L${cx + 8} ${cy} L${cx} ${cy + 8} L${cx - 8} ${cy} Z`, class: "ev cause" }, tip));
    } else {
      svg.append(s("circle", { cx, cy, r: e.role === "symptom" ? 5 : 3.5, class: `ev ${e.role}` }, tip));
    }
  }
  if (first) {
    const fx = x(first.ms);
    const fy = y(first.lane);
    svg.append(s("line", { x1: fx, x2: fx, y1: TOP, y2: height - 14, class: "first-line" }));
    svg.append(s("circle", { cx: fx, cy: fy, r: 13, class: "first-ring" }));
    const label = `began here: ${first.lane} ${hms(first.ms)}`;
    const right = fx + 16 + label.length * 7 < WIDTH;
    svg.append(s("text", { x: right ? fx + 17 : fx - 17, y: fy - 12, class: "first-label", "text-anchor": right ? "start" : "end" }, label));
  }
  figure.append(svg);
  const legend = document.createElement("figcaption");
  legend.className = "legend";
  legend.innerHTML = '<span><svg width="14" height="14" aria-hidden="true"><path d="M7 1 L13 7 L7 13 L1 7 Z" class="ev cause"/></svg>root cause</span>'
    + '<span><svg width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="5" class="ev symptom"/></svg>symptom</span>'
    + '<span><svg width="14" height="14" aria-hidden="true"><circle cx="7" cy="7" r="3.5" class="ev context"/></svg>context</span>'
    + '<span><svg width="18" height="14" aria-hidden="true"><circle cx="9" cy="7" r="6" class="first-ring"/></svg>first root-cause event</span>'
    + `<span class="muted">UTC · ${rows.length} lane${rows.length === 1 ? "" : "s"} with evidence of ${(diagnosis.attempt?.nodes || []).length} nodes</span>`;
  figure.append(legend);
  return figure;
}
