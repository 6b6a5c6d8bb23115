// The diagnosis list: newest first, filtered and paged by the server (GET /v1/diagnoses).
//
// Live updates poll the list with If-None-Match rather than holding a Server-Sent Events stream
// fed by the service's watch(): the ETag is computed from the store (count and newest `created` of
// the diagnoses table), so a page open on one replica also sees diagnoses another replica stored in
// the shared PostgreSQL, which watch() (in-process, like gRPC WatchDiagnoses) cannot; a poll that
// finds nothing new costs one indexed query and a 304, holds no connection open (no browser
// per-host connection limit, nothing to drain at shutdown), and resumes by itself after a restart.
import { NeedsToken, fmtTime, getJSON, h, outcomeBadge, provisionalBadge, setLive } from "./dom.js";

const OUTCOMES = ["attributed", "ambiguous", "unattributed", "not_failed"];
const DOMAINS = ["hardware", "network", "storage", "software", "resource", "external"];
const FILTERS = ["search", "cluster", "outcome", "domain", "node", "since", "until"];
const RANGES = [["", "Any time"], ["1h", "Last hour"], ["24h", "Last 24 hours"], ["7d", "Last 7 days"],
  ["30d", "Last 30 days"], ["custom", "Between…"]];
const RANGE_MS = { "1h": 3600e3, "24h": 86400e3, "7d": 7 * 86400e3, "30d": 30 * 86400e3 };
const PAGE = 50;  // rows per page; `limit` in the location hash changes it (1 to 200)
const POLL_MS = 3000;

export async function renderList(main, params) {
  const perPage = Math.min(200, Math.max(1, Number(params.get("limit")) || PAGE));
  const state = {
    filters: Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""])),
    range: params.get("range") || (params.get("since") || params.get("until") ? "custom" : ""),
    cursors: [],                      // the cursors of the pages before this one ("Newer" pops)
    cursor: params.get("cursor") || "",
    etag: null,
    seen: null,                       // ids shown by the previous load: what is new on the next
    busy: false,
  };

  const input = (name, label, attrs = {}) => h("label", { class: "field" }, h("span", {}, label),
    h("input", { name, value: state.filters[name], autocomplete: "off", spellcheck: "false", ...attrs }));
  const select = (name, label, options) => h("label", { class: "field" }, h("span", {}, label),
    h("select", { name }, h("option", { value: "" }, "any"),
      options.map((o) => h("option", { value: o, selected: state.filters[name] === o }, o.replace("_", " ")))));
  const utc = (iso) => (iso ? iso.replace(/Z$/, "").slice(0, 16) : "");

  const form = h("form", { class: "filters", role: "search", "aria-label": "Filter diagnoses",
    onsubmit: (e) => { e.preventDefault(); apply(); } },
    input("search", "Workload", { type: "search", placeholder: "job id contains…", class: "wide" }),
    select("outcome", "Outcome", OUTCOMES),
    select("domain", "Domain", DOMAINS),
    input("cluster", "Cluster", { placeholder: "any" }),
    input("node", "Culprit node", { placeholder: "any" }),
    h("label", { class: "field" }, h("span", {}, "Time"),
      h("select", { name: "range" }, RANGES.map(([v, t]) => h("option", { value: v, selected: state.range === v }, t)))),
    h("label", { class: "field custom" }, h("span", {}, "From (UTC)"),
      h("input", { name: "since", type: "datetime-local", value: utc(state.filters.since) })),
    h("label", { class: "field custom" }, h("span", {}, "To (UTC)"),
      h("input", { name: "until", type: "datetime-local", value: utc(state.filters.until) })),
    h("div", { class: "actions" },
      h("button", { type: "submit" }, "Apply"),
      h("button", { type: "button", class: "quiet", onclick: reset }, "Reset")));
  const caption = h("p", { class: "count", id: "list-count", "aria-live": "polite" });
  const tbody = h("tbody");
  const table = h("table", { class: "diagnoses", "aria-describedby": "list-count" },
    h("colgroup", {}, h("col", { class: "c-time" }), h("col", { class: "c-work" }), h("col", { class: "c-cluster" }),
      h("col", { class: "c-outcome" }), h("col", { class: "c-cause" }), h("col", { class: "c-nodes" })),
    h("thead", {}, h("tr", {}, ["Window end (UTC)", "Workload", "Cluster", "Outcome", "Root cause", "Culprit nodes"]
      .map((t) => h("th", { scope: "col" }, t)))),
    tbody);
  const newer = h("button", { type: "button", onclick: () => page(-1) }, "← Newer");
  const older = h("button", { type: "button", onclick: () => page(1) }, "Older →");
  const pager = h("nav", { class: "pager", "aria-label": "Pages" }, newer, older);
  main.replaceChildren(h("h1", { class: "sr-only" }, "Diagnoses"), form, caption, h("div", { class: "table-wrap" }, table), pager);
  syncCustom();
  form.elements.range.addEventListener("change", () => { syncCustom(); if (form.elements.range.value !== "custom") apply(); });
  for (const name of ["outcome", "domain"]) form.elements[name].addEventListener("change", apply);
  let typing = 0;
  for (const name of ["search", "cluster", "node"]) {
    form.elements[name].addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(apply, 350); });
  }

  function syncCustom() {
    form.classList.toggle("show-custom", form.elements.range.value === "custom");
  }

  function reset() {
    form.reset();
    for (const el of form.querySelectorAll("input")) el.value = "";
    for (const el of form.querySelectorAll("select")) el.value = "";
    syncCustom();
    apply();
  }

  function apply() {
    const f = {};
    for (const k of ["search", "cluster", "outcome", "domain", "node"]) f[k] = form.elements[k].value.trim();
    const range = form.elements.range.value;
    f.since = f.until = "";
    if (range in RANGE_MS) f.since = new Date(Date.now() - RANGE_MS[range]).toISOString().replace(/\.\d+Z$/, "Z");
    if (range === "custom") {
      for (const k of ["since", "until"]) f[k] = form.elements[k].value ? `${form.elements[k].value}:00Z` : "";
    }
    state.filters = f;
    state.range = range;
    state.cursors = [];
    state.cursor = "";
    state.etag = null;
    state.seen = null;
    load();
  }

  function page(step) {
    if (step > 0 && older.dataset.next) { state.cursors.push(state.cursor); state.cursor = older.dataset.next; }
    else if (step < 0) state.cursor = state.cursors.pop() || "";
    state.etag = null;
    state.seen = null;
    load().then(() => tbody.querySelector("tr[tabindex]")?.focus());
  }

  function query(withPaging) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(state.filters)) if (v) q.set(k, v);
    if (state.range && state.range !== "custom") q.set("range", state.range);
    if (perPage !== PAGE) q.set("limit", perPage);
    if (withPaging && state.cursor) q.set("cursor", state.cursor);
    return q;
  }

  // A load the user asked for (filters, paging) supersedes one in flight; a poll is skipped while
  // another load runs. Only the latest load's answer is drawn.
  let latest = 0;
  async function load(poll = false) {
    if (poll && state.busy) return;
    const mine = ++latest;
    state.busy = true;
    try {
      // the hash keeps the filters (a link to this list); replaceState does not re-render the view
      const shown = query(true).toString();
      history.replaceState(null, "", `#/${shown ? `?${shown}` : ""}`);
      sessionStorage.setItem("hypocenter-list", location.hash);  // the detail's way back to this list
      const api = query(true);
      api.delete("range");
      api.set("limit", perPage);
      const res = await getJSON(`/v1/diagnoses?${api}`, state.etag);
      if (mine !== latest) return;
      setLive(`Live · checked ${new Date().toISOString().slice(11, 19)} UTC`);
      if (res.notModified) return;
      state.etag = res.etag;
      render(res.body);
    } catch (err) {
      if (err instanceof NeedsToken && !poll) throw err;  // the router asks for a token
      if (mine !== latest) return;
      setLive(`Not updating: ${err.message}`);
      if (state.seen === null) tbody.replaceChildren(h("tr", {}, h("td", { colspan: 6, class: "error" }, err.message)));
    } finally {
      if (mine === latest) state.busy = false;
    }
  }

  function render(body) {
    const before = state.seen;
    state.seen = new Set(body.diagnoses.map((d) => d.id));
    const known = new Set([...tbody.querySelectorAll("tr[data-key]")].map((tr) => tr.dataset.key));
    const focused = document.activeElement?.closest?.("tr[data-id]")?.dataset.id;
    const rows = body.diagnoses.map((d) => row(d, before !== null && !before.has(d.id), known));
    tbody.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 6, class: "empty" },
      "No diagnoses match these filters."))]));
    if (focused) tbody.querySelector(`tr[data-id="${CSS.escape(focused)}"]`)?.focus();
    const first = state.cursors.length * perPage;
    caption.textContent = body.total
      ? `${(first + 1).toLocaleString("en")}–${(first + body.diagnoses.length).toLocaleString("en")} of ${body.total.toLocaleString("en")} diagnoses, newest first`
      : "No diagnoses";
    newer.disabled = !state.cursor;
    older.disabled = !body.next_cursor;
    older.dataset.next = body.next_cursor || "";
    const fresh = rows.filter((r) => r.classList.contains("fresh")).length;
    if (fresh) setLive(`${fresh} new or replaced diagnos${fresh === 1 ? "is" : "es"} · ${new Date().toISOString().slice(11, 19)} UTC`);
  }

  function row(d, fresh, known) {
    const key = `${d.workload}\u0000${d.attempt}`;
    const open = () => { location.hash = `#/d/${encodeURIComponent(d.id)}`; };
    const cause = d.domain ? `${d.domain} / ${d.subdomain || "–"}` : "–";
    const nodes = d.nodes.slice(0, 3).join(", ") + (d.nodes.length > 3 ? ` +${d.nodes.length - 3}` : "");
    return h("tr", {
      tabindex: 0, class: [fresh ? "fresh" : "", d.provisional ? "is-provisional" : ""].join(" ").trim() || null,
      dataset: { id: d.id, key }, "aria-label": `${d.workload} attempt ${d.attempt}: ${d.outcome} ${cause}`,
      onclick: open,
      onkeydown: (e) => {
        if (e.key === "Enter") { e.preventDefault(); open(); }
        else if (e.key === "ArrowDown") { e.preventDefault(); e.currentTarget.nextElementSibling?.focus(); }
        else if (e.key === "ArrowUp") { e.preventDefault(); e.currentTarget.previousElementSibling?.focus(); }
      },
    },
      h("td", { class: "mono" }, fmtTime(d.window_end || d.created)),
      h("td", {}, h("a", { href: `#/d/${encodeURIComponent(d.id)}`, tabindex: -1 }, d.workload),
        d.attempt ? h("span", { class: "muted" }, ` #${d.attempt}`) : null,
        fresh ? h("span", { class: "badge new" }, known.has(key) ? "replaced" : "new") : null),
      h("td", {}, d.cluster || "–"),
      h("td", {}, outcomeBadge(d.outcome), d.provisional ? provisionalBadge() : null),
      h("td", { class: "cause" }, h("div", {}, cause), d.summary ? h("div", { class: "summary-line muted", title: d.summary }, d.summary) : null),
      h("td", { class: "mono" }, nodes || "–"));
  }

  await load();
  const timer = setInterval(() => { if (!document.hidden) load(true); }, POLL_MS);
  return () => clearInterval(timer);
}
