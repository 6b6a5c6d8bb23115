// The page's router. Views are modules that render into <main>
// from the REST API; the location hash holds the view and its filters, so a filtered list or a
// diagnosis is a link one can paste into an incident channel.
import { renderList } from "./list.js";
import { renderDetail } from "./detail.js";
import { renderFleet } from "./fleet.js";
import { h, setLive } from "./dom.js";

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
    const current = (a.dataset.nav === "fleet") === path.startsWith("/fleet") && !path.startsWith("/d/");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  try {
    if (path.startsWith("/d/")) stopView = await renderDetail(main, decodeURIComponent(path.slice(3)));
    else if (path.startsWith("/fleet")) stopView = await renderFleet(main, params);
    else stopView = await renderList(main, params);
  } catch (err) {
    main.replaceChildren(h("p", { class: "error", role: "alert" }, `Could not load: ${err.message}`));
  }
}

window.addEventListener("hashchange", show);
show();
