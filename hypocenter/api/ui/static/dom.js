// Helpers every view shares: the element builder, time and badge formatting, REST reads.

let config = null;

export async function getConfig() {
  if (config === null) {
    try { config = (await getJSON("/ui/config.json")).body; } catch { config = { grafana_url: "" }; }
  }
  return config;
}

// A tiny element builder: h("td", {class: "x"}, "text", child, ...).
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") el.style.cssText = v; // through the CSSOM: the page's CSP refuses style attributes
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export function fmtTime(iso, withDate = true) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const t = d.toISOString();
  return withDate ? `${t.slice(0, 10)} ${t.slice(11, 19)}` : t.slice(11, 19);
}

export function outcomeBadge(outcome) {
  return h("span", { class: `badge o-${outcome}` }, outcome.replace("_", " "));
}

export function provisionalBadge() {
  return h("span", { class: "badge provisional", title: "the attempt had not ended when it was analysed" }, "provisional");
}

export function setLive(text) {
  document.getElementById("live").textContent = text;
}

// A server with tokens (auth_tokens_file) wants one with the read role on every read: the page asks
// once and keeps it for this tab only (sessionStorage).
export const TOKEN_KEY = "hypocenter-token";

export class NeedsToken extends Error {}

export async function getJSON(url, etag) {
  const headers = etag ? { "If-None-Match": etag } : {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(url, { headers });
  if (r.status === 401 || r.status === 403) {
    let message = `${r.status}`;
    try { message = (await r.json()).message || message; } catch { /* not JSON */ }
    throw new NeedsToken(message);
  }
  if (r.status === 304) return { notModified: true, etag };
  if (!r.ok) {
    let message = `${r.status} ${r.statusText}`;
    try { message = (await r.json()).message || message; } catch { /* not JSON */ }
    throw new Error(message);
  }
  return { body: await r.json(), etag: r.headers.get("ETag"), headers: r.headers };
}
