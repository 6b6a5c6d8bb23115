// The cost view: what failures cost in the cost window (GET /v1/fleet/cost, the numbers /metrics
// and the Grafana "cost of failures" dashboard show): the Pareto of causes, the worst components,
// MTTF per domain and the workloads with the lowest effective training time ratio.
import { getJSON, h } from "./dom.js";

const hours = (x) => x.toLocaleString("en", { maximumFractionDigits: 1 });
const bar = (value, top) => h("span", { class: "bar", style: `--w:${top ? Math.round(100 * value / top) : 0}%` });

function table(title, head, rows, empty) {
  return h("section", { class: "card" },
    h("h2", {}, title),
    rows.length ? h("table", { class: "fleet cost" },
      h("thead", {}, h("tr", {}, head.map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows))
      : h("p", { class: "empty" }, empty));
}

export async function renderCost(main, params) {
  const q = new URLSearchParams();
  if (params.get("limit")) q.set("limit", params.get("limit"));
  const { body } = await getJSON(`/v1/fleet/cost?${q}`);
  const t = body.total;
  const topCause = body.causes.length ? body.causes[0].gpu_hours_lost : 0;
  const topComp = body.components.length ? body.components[0].gpu_hours_lost : 0;
  const causes = body.causes.map((c) => h("tr", {},
    h("td", {}, h("a", { href: `#/?domain=${encodeURIComponent(c.domain)}` }, `${c.domain}/${c.subdomain}`)),
    h("td", { class: "num" }, bar(c.gpu_hours_lost, topCause), hours(c.gpu_hours_lost)),
    h("td", { class: "num" }, `${(100 * c.share).toFixed(1)} %`),
    h("td", { class: "num" }, `${(100 * c.cumulative_share).toFixed(1)} %`),
    h("td", { class: "num" }, c.attempts),
    h("td", { class: "num" }, c.median_time_to_detect_s === null ? "–" : `${Math.round(c.median_time_to_detect_s)} s`)));
  const comps = body.components.map((c) => h("tr", {},
    h("td", { class: "mono" }, c.name), h("td", {}, c.kind),
    h("td", { class: "num" }, bar(c.gpu_hours_lost, topComp), hours(c.gpu_hours_lost)),
    h("td", { class: "num" }, c.workloads)));
  const domains = body.domains.map((d) => h("tr", {},
    h("td", {}, d.domain), h("td", { class: "num" }, d.failures),
    h("td", { class: "num" }, `${(d.mttf_s / 3600).toFixed(1)} h`), h("td", { class: "num" }, hours(d.gpu_hours_lost))));
  const workloads = body.workloads.map((w) => h("tr", {},
    h("td", { class: "mono" }, w.cluster ? `${w.cluster}/${w.workload}` : w.workload),
    h("td", { class: "num" }, `${(100 * w.ettr).toFixed(1)} %`), h("td", { class: "num" }, w.attempts)));
  main.replaceChildren(
    h("h1", {}, "Cost of failures"),
    h("p", { class: "muted", id: "cost-total" },
      `${hours(t.gpu_hours_lost)} ± ${hours(t.gpu_hours_uncertainty)} GPU-hours lost over ${t.failed_attempts} failed attempts `
      + `in the last ${Math.round(body.window_s / 86400)} days (${t.attempts_without_cost} without an estimate: GPUs unknown). `
      + "Lost work since the last checkpoint, time to detect and restart overhead, times the GPUs in scope."),
    h("div", { class: "fleet-grid" },
      table("Causes (Pareto)", ["Cause", "GPU-hours", "Share", "Cumulative", "Attempts", "Time to detect"], causes, "No failure in this window."),
      table("Worst components", ["Component", "Kind", "GPU-hours", "Workloads"], comps, "No culprit component in this window."),
      table("MTTF per domain", ["Domain", "Failures", "MTTF", "GPU-hours"], domains, "No failure in this window."),
      table("Lowest ETTR", ["Workload", "ETTR", "Attempts"], workloads, "No workload with every part known.")));
  return null;
}
