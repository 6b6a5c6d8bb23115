// The page's router. Views are modules that render into <main>
// from the REST API; the location hash holds the view and its filters, so a filtered list or a
// diagnosis is a link one can paste into an incident channel.
import { renderList } from "./list.js";
import { renderDetail } from "./detail.js";
import { renderFleet } from "./fleet.js";
import { renderCost } from "./cost.js";
import { NeedsToken, TOKEN_KEY, h, setLive } from "./dom.js";

let stopView = null;

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = hash.split("?");
  return { path, params: new URLSearchParams(query) };
}

async function show() {
  if (stopView) { stopView(); stopView = null; }
  setLive("");
  const main = document.getElementById("main");
  const { path, params } = route();
  for (const a of document.querySelectorAll("[data-nav]")) {
    const view = path.startsWith("/fleet") ? "fleet" : path.startsWith("/cost") ? "cost" : "list";
    const current = a.dataset.nav === view && !path.startsWith("/d/");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  try {
    if (path.startsWith("/d/")) stopView = await renderDetail(main, decodeURIComponent(path.slice(3)));
    else if (path.startsWith("/fleet")) stopView = await renderFleet(main, params);
    else if (path.startsWith("/cost")) stopView = await renderCost(main, params);
    else stopView = await renderList(main, params);
  } catch (err) {
    if (err instanceof NeedsToken) { askToken(main, err.message); return; }
    main.replaceChildren(h("p", { class: "error", role: "alert" }, `Could not load: ${err.message}`));
  }
}

function askToken(main, message) {
  const input = h("input", { type: "password", name: "token", autocomplete: "off", required: true, class: "wide" });
  main.replaceChildren(h("form", { class: "filters token", onsubmit: (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    show();
  } },
  h("p", { role: "alert" }, `This server asks for a token with the read role (${message}). It is kept for this tab only.`),
  h("label", { class: "field" }, h("span", {}, "Token"), input),
  h("div", { class: "actions" }, h("button", { type: "submit" }, "Use token"))));
  input.focus();
}

window.addEventListener("hashchange", show);
show();
