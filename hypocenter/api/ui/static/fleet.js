// The fleet view: nodes and components (GPUs, ports) that keep appearing as root causes
// (GET /v1/fleet/culprits, counted as /metrics counts them), each linking to its diagnoses.
import { getJSON, h } from "./dom.js";

export async function renderFleet(main, params) {
  const q = new URLSearchParams();
  for (const k of ["window_s", "cluster"]) if (params.get(k)) q.set(k, params.get(k));
  const { body } = await getJSON(`/v1/fleet/culprits?${q}`);
  const hours = Math.round(body.window_s / 3600);
  const table = (title, rows, component) => h("section", { class: "card" },
    h("h2", {}, title),
    rows.length ? h("table", { class: "fleet" },
      h("thead", {}, h("tr", {}, (component ? ["Component", "Kind", "Node", "Cluster", "Diagnoses"] : ["Node", "Cluster", "Diagnoses"])
        .map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", {}, rows.map((r) => h("tr", {},
        component ? [h("td", { class: "mono" }, h("a", { href: r.list_url.replace(/^\/ui\//, "") }, r.component)), h("td", {}, r.kind),
          h("td", { class: "mono" }, r.node)] : [h("td", { class: "mono" }, h("a", { href: r.list_url.replace(/^\/ui\//, "") }, r.node))],
        h("td", {}, r.cluster || "–"),
        h("td", { class: "num" }, h("span", { class: "bar", style: `--w:${Math.round(100 * r.diagnoses / rows[0].diagnoses)}%` }), r.diagnoses)))))
      : h("p", { class: "empty" }, "None in this window."));
  main.replaceChildren(
    h("h1", {}, "Fleet: repeat culprits"),
    h("p", { class: "muted" }, `${body.diagnoses.toLocaleString("en")} final diagnoses in the last ${hours} hours. `
      + "A node or component named in the root cause of several diagnoses is the first place to look."),
    h("div", { class: "fleet-grid" },
      table("Nodes", body.nodes, false),
      table("GPUs and fabric ports", body.components, true)));
  return null;
}
