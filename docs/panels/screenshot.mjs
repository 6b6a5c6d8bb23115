// node screenshot.mjs PAGE.html OUT.png WIDTH HEIGHT — headless Chromium (/usr/bin/chromium, or $CHROMIUM)
// through playwright-core: a viewport of exactly WIDTH x HEIGHT CSS px at scale 1, a fresh profile.
// Fails when the page reports an error or draws nothing.
import { chromium } from "playwright-core";
import { pathToFileURL } from "node:url";

const [page_, out, width, height] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--allow-file-access-from-files"],
});
try {
  const context = await browser.newContext({ viewport: { width: +width, height: +height }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  const errors = [];
  page.on("pageerror", e => errors.push(String(e)));
  page.on("console", m => { if (m.type() === "error") errors.push(m.text()); });
  await page.goto(pathToFileURL(page_).href, { waitUntil: "load" });
  await page.waitForFunction(() => document.body.dataset.drawn === "yes", null, { timeout: 30000 });
  if (errors.length) throw new Error("the page failed: " + errors.join("; "));
  await page.screenshot({ path: out, clip: { x: 0, y: 0, width: +width, height: +height } });
} finally {
  await browser.close();
}
