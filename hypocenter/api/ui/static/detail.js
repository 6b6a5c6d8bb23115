// One diagnosis (GET /v1/diagnoses/{id}): the verdict, the timeline across nodes, the evidence
// trail, candidates, coverage per source, links to the attempt's logs in Grafana, and the JSON.
import { fmtTime, getConfig, getJSON, h, outcomeBadge, provisionalBadge } from "./dom.js";
import { drawTimeline } from "./timeline.js";

const dl = (pairs) => h("dl", { class: "facts" }, pairs.filter(([, v]) => v !== null && v !== undefined && v !== "")
  .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));

const nodeLink = (n) => h("a", { href: `#/?node=${encodeURIComponent(n)}`, class: "mono", title: `diagnoses naming ${n}` }, n);
const joinNodes = (nodes) => (nodes?.length ? nodes.flatMap((n, i) => (i ? [", ", nodeLink(n)] : [nodeLink(n)])) : "–");
const component = (c) => h("span", { class: "chip mono" }, `${c.node} ${c.kind} ${c.id}`);

function verdict(d, provisional) {
  const rc = d.root_cause;
  const q = d.quality || { level: "low", reasons: [] };
  return h("section", { class: "card verdict", "aria-labelledby": "verdict-h" },
    h("h2", { id: "verdict-h" }, "Verdict"),
    h("div", { class: "verdict-head" },
      outcomeBadge(d.outcome), provisional ? provisionalBadge() : null,
      rc ? h("span", { class: "domain" }, `${rc.domain} / ${rc.subdomain}`) : h("span", { class: "domain muted" }, "no root cause"),
      rc?.action ? h("span", { class: "action", title: "recommended action" }, rc.action.replaceAll("_", " ")) : null),
    rc ? h("p", { class: "summary" }, rc.summary) : h("p", { class: "summary" }, d.outcome === "not_failed"
      ? "The attempt did not fail." : "Not enough evidence to name a cause (hypocenter abstains rather than guesses)."),
    dl([
      ["Culprit nodes", rc ? joinNodes(rc.nodes) : null],
      ["Components", rc?.components?.length ? h("span", {}, rc.components.map(component)) : null],
      ["First seen", rc?.first_seen ? h("span", { class: "mono" }, fmtTime(rc.first_seen)) : null],
      ["Rule", rc?.rule ? h("code", {}, rc.rule) : null],
      ["First failure", firstFailure(d.first_failure)],
      ["Quality", h("span", {}, h("span", { class: `badge q-${q.level}` }, q.level),
        q.reasons.length ? h("ul", { class: "reasons" }, q.reasons.map((r) => h("li", {}, r))) : h("span", { class: "muted" }, " no reservations"))],
    ]));
}

// Where an abstaining diagnosis says the failure began: the first process to fail, how, and what to check.
function firstFailure(ff) {
  if (!ff) return null;
  const who = [ff.rank !== null && ff.rank !== undefined ? `rank ${ff.rank}` : "a process", ff.node ? ` on ${ff.node}` : ""].join("");
  const how = ff.signal ? `killed by ${ff.signal}` : ff.exit_code !== null && ff.exit_code !== undefined ? `exit code ${ff.exit_code}` : "failed";
  return h("span", { class: "first-failure" },
    ff.node ? nodeLink(ff.node) : null, h("span", {}, ` ${who} · ${how}`),
    ff.time ? h("span", { class: "mono muted" }, ` · ${fmtTime(ff.time)}`) : null,
    ff.next_step ? h("div", { class: "small" }, ff.next_step) : null);
}

function attemptCard(d, cfg) {
  const a = d.attempt || {};
  const links = grafanaLinks(d, cfg);
  return h("section", { class: "card", "aria-labelledby": "attempt-h" },
    h("h2", { id: "attempt-h" }, "Attempt"),
    dl([
      ["Workload", h("span", { class: "mono" }, `${a.workload_id} #${a.attempt}`)],
      ["Scheduler", a.scheduler], ["Cluster", a.cluster],
      ["Window (UTC)", a.window ? h("span", { class: "mono" }, `${fmtTime(a.window.start)} → ${fmtTime(a.window.end, false)}`) : null],
      ["Terminal state", d.terminal_state],
      ["Nodes", `${(a.nodes || []).length} (${(d.affected_nodes || []).length} affected)`],
      ["Logs", links.length ? h("span", { class: "links" }, links) : h("span", { class: "muted" }, "set ui_grafana_url to link to Grafana Explore")],
    ]));
}

// A LogQL stream selector matching any of `nodes` exactly: each name escaped for the regex, then the
// regex for the double-quoted LogQL string (a backslash and a quote in a node name stay themselves).
export function lokiNodeSelector(label, nodes) {
  const regex = nodes.map((n) => n.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|");
  return `{${label}=~"${regex.replace(/[\\"]/g, "\\$&")}"}`;
}

// Grafana Explore on the attempt's window, with the Loki data source and a node selector.
function grafanaLinks(d, cfg) {
  if (!cfg.grafana_url || !d.attempt?.window) return [];
  const from = Date.parse(d.attempt.window.start) - 300e3;
  const to = Date.parse(d.attempt.window.end) + 300e3;
  const link = (label, nodes) => {
    const ds = { type: "loki", uid: cfg.loki_datasource_uid };
    const pane = { datasource: cfg.loki_datasource_uid, queries: [{ refId: "A", datasource: ds, queryType: "range",
      expr: lokiNodeSelector(cfg.loki_node_label, nodes) }], range: { from: String(from), to: String(to) } };
    const url = `${cfg.grafana_url}/explore?schemaVersion=1&orgId=1&panes=${encodeURIComponent(JSON.stringify({ hc: pane }))}`;
    return h("a", { href: url, target: "_blank", rel: "noopener", class: "ext" }, label);
  };
  const out = [];
  const culprits = d.root_cause?.nodes || [];
  if (culprits.length) out.push(link("culprit nodes' logs", culprits));
  if ((d.attempt.nodes || []).length) out.push(link("all nodes' logs", d.attempt.nodes));
  return out;
}

function candidates(d) {
  if (!d.candidates?.length) return null;
  return h("section", { class: "card", "aria-labelledby": "cand-h" },
    h("h2", { id: "cand-h" }, `Candidates (${d.candidates.length})`),
    h("p", { class: "muted" }, d.outcome === "unattributed"
      ? "No cause could be attributed. These are the causes weighed, most likely first, each with the lines it rests on (evidence trail) and why it falls short."
      : "Several causes fit and none explains the others; each is listed with its own action."),
    h("ol", { class: "candidates" }, d.candidates.map((c) => h("li", {},
      h("strong", {}, `${c.domain} / ${c.subdomain}`), " on ", joinNodes(c.nodes),
      c.action ? h("span", { class: "action" }, c.action.replaceAll("_", " ")) : null,
      h("div", {}, c.summary),
      c.components?.length ? h("div", {}, c.components.map(component)) : null,
      h("div", { class: "muted mono small" }, `${c.rule} · first seen ${fmtTime(c.first_seen)}`)))));
}

function symptoms(d) {
  if (!d.symptoms?.length) return null;
  return h("section", { class: "card", "aria-labelledby": "sym-h" },
    h("h2", { id: "sym-h" }, "Symptoms (consequences, not causes)"),
    h("table", { class: "compact" },
      h("thead", {}, h("tr", {}, ["Kind", "Count", "Nodes", "First seen", "Example"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, d.symptoms.map((x) => h("tr", {},
        h("td", {}, x.kind.replaceAll("_", " ")), h("td", { class: "num" }, x.count),
        h("td", { class: "mono" }, x.nodes.length > 3 ? `${x.nodes.slice(0, 3).join(", ")} +${x.nodes.length - 3}` : x.nodes.join(", ") || "–"),
        h("td", { class: "mono" }, fmtTime(x.first_seen, false)),
        h("td", { class: "logline" }, x.example || ""))))));
}

// The evidence trail, grouped by the file (or stream) it cites, in line order, with the lines
// around each claim when the store still holds the attempt's logs (GET /v1/diagnoses/{id}/context;
// attempts that arrived over OTLP). A gap between line numbers says how many lines are not shown.
function evidence(d, context) {
  const groups = new Map();
  for (const e of d.evidence || []) {
    const m = /^(.*):(\d+)$/.exec(e.ref || "");
    const file = m ? m[1] : e.ref || "(no reference)";
    if (!groups.has(file)) groups.set(file, []);
    groups.get(file).push({ ...e, line: m ? Number(m[2]) : null });
  }
  const blocks = [];
  for (const [file, cited] of groups) {
    const citedLines = new Set(cited.map((e) => e.line));
    const around = (context?.files?.[file] || []).filter((c) => c.kept && !citedLines.has(c.line))
      .map((c) => ({ line: c.line, text: c.text, role: "around" }));
    const lines = [...cited, ...around].sort((a, b) => (a.line ?? 0) - (b.line ?? 0));
    const rows = [];
    let prev = null;
    for (const e of lines) {
      if (prev !== null && e.line !== null && e.line - prev > 1) {
        rows.push(h("div", { class: "gap" }, `⋯ ${e.line - prev - 1} line${e.line - prev - 1 === 1 ? "" : "s"} not shown`));
      }
      prev = e.line;
      rows.push(h("div", { class: `line r-${e.role}` },
        h("span", { class: "ln mono" }, e.line ?? ""),
        h("span", { class: `role r-${e.role}` }, e.role === "around" ? "" : e.role.replace("_", " ")),
        h("span", { class: "t mono" }, e.time ? fmtTime(e.time, false) : ""),
        h("span", { class: "text mono", title: e.rule ? `rule ${e.rule}` : null }, e.text)));
    }
    const nodes = [...new Set(cited.map((e) => e.node).filter(Boolean))];
    blocks.push(h("div", { class: "ev-file" },
      h("div", { class: "ev-head" }, h("code", {}, file), h("span", { class: "muted" }, ` ${nodes.join(", ")} · ${cited[0].source}`)),
      rows));
  }
  const note = context?.available
    ? `with ${context.around} stored lines around each (lines no rule reads are blanked by compaction and not shown)`
    : "the store holds no logs for this attempt (an uploaded bundle): the cited lines alone";
  return h("section", { class: "card", "aria-labelledby": "ev-h" },
    h("h2", { id: "ev-h" }, `Evidence trail (${(d.evidence || []).length} lines)`),
    h("p", { class: "muted small" }, note),
    blocks.length ? blocks : h("p", { class: "empty" }, "No evidence."));
}

function coverage(d) {
  return h("section", { class: "card", "aria-labelledby": "cov-h" },
    h("h2", { id: "cov-h" }, "Coverage per source"),
    h("table", { class: "compact" },
      h("thead", {}, h("tr", {}, ["Connector", "Source", "Status", "Observations", "Reason"].map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, (d.coverage || []).map((c) => h("tr", {},
        h("td", {}, c.connector), h("td", { class: "mono" }, c.source),
        h("td", {}, h("span", { class: `badge s-${c.status}` }, c.status)),
        h("td", { class: "num" }, (c.observations ?? 0).toLocaleString("en")), h("td", {}, c.reason || ""))))));
}

export async function renderDetail(main, id) {
  const [{ body: d, headers }, cfg, context] = await Promise.all([getJSON(`/v1/diagnoses/${encodeURIComponent(id)}`),
    getConfig(), getJSON(`/v1/diagnoses/${encodeURIComponent(id)}/context?around=3`).then((r) => r.body, () => null)]);
  const provisional = headers.get("X-Hypocenter-Provisional") === "true";
  const a = d.attempt || {};
  const json = JSON.stringify(d, null, 2);
  main.replaceChildren(...[
    h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: sessionStorage.getItem("hypocenter-list") || "#/" }, "← Diagnoses")),
    h("h1", {}, h("span", { class: "mono" }, a.workload_id), h("span", { class: "muted" }, ` attempt ${a.attempt}`),
      a.cluster ? h("span", { class: "muted" }, ` · ${a.cluster}`) : null),
    h("div", { class: "detail-top" }, verdict(d, provisional), attemptCard(d, cfg)),
    h("section", { class: "card", "aria-labelledby": "tl-h" }, h("h2", { id: "tl-h" }, "Where it began"), drawTimeline(d)),
    candidates(d),
    evidence(d, context),
    symptoms(d),
    coverage(d),
    h("section", { class: "card" }, h("details", {}, h("summary", {}, h("h2", { class: "inline" }, "Diagnosis JSON"),
      h("span", { class: "muted" }, ` ${d.schema} · ${d.id} · engine ${d.engine?.version || ""}`)),
      h("div", { class: "json-actions" }, h("a", { href: `/v1/diagnoses/${encodeURIComponent(id)}`, target: "_blank", rel: "noopener" }, "open raw"),
        h("button", { type: "button", class: "quiet", onclick: () => navigator.clipboard?.writeText(json) }, "copy")),
      h("pre", { class: "json" }, json)))].filter(Boolean));
  window.scrollTo(0, 0);
  main.focus({ preventScroll: true });
  return null;
}
