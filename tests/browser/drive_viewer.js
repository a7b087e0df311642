// Drive `rh3dgs view` in headless Debian chromium (playwright-core, no browser download).
//
//   node drive_viewer.js URL OUTDIR QUERY [HEAT_OUTPUT_LABEL]
//
// Steps (each waits for the viewer's "Frame N (full) ..." line before the screenshot):
//   1. open the page                          -> OUTDIR/rgb.png      (no query)
//   2. type QUERY into "Positives"            -> OUTDIR/overlay.png  (default output: RGB + relevancy)
//   3. untick "Show selection", choose HEAT_OUTPUT_LABEL in "Output"
//                                             -> OUTDIR/heat.png     (turbo heat map)
//   4. click "Export selection", wait for "Exported ..."
//   5. drag on the canvas (orbit), collecting the "(moving)" frame lines -> OUTDIR/moved.png
// Prints one JSON line: {"frames": {...}, "export": "...", "moving": [...], "panel": {x, y, width, height}, ...}.
// Exit code 1 with a message on any failure (timeouts included).
'use strict';
const path = require('path');
const { inputFor, panelBox, drive } = require('./common');

const [url, outdir, query, heatLabel = 'Relevancy (turbo)'] = process.argv.slice(2);
const TIMEOUT = Number(process.env.VIEWER_TIMEOUT_MS || 90000);

function frameInfo(text) {
  const m = /Frame\s+(\d+)\s+\((full|moving)\)/.exec(text || '');
  return m ? { n: Number(m[1]), full: m[2] === 'full', text } : null;
}

async function infoText(page) {
  const loc = page.getByText(/Frame\s+\d+\s+\(/).first();
  return (await loc.count()) ? await loc.innerText() : '';
}

// Wait for a full-resolution frame numbered above `after` whose line satisfies `pred`.
// `moving` (optional array) collects the "(moving)" frame lines seen on the way.
async function waitFullFrame(page, after, pred = () => true, moving = null) {
  const t0 = Date.now();
  for (;;) {
    const f = frameInfo(await infoText(page));
    if (moving && f && f.n > after && !f.full && !moving.includes(f.text)) moving.push(f.text);
    if (f && f.full && f.n > after && pred(f.text)) {
      await page.waitForTimeout(1500); // let the browser decode and draw the background image
      return f;
    }
    if (Date.now() - t0 > TIMEOUT) throw new Error(`no full frame after #${after} within ${TIMEOUT} ms (last: ${f && f.text})`);
    await page.waitForTimeout(moving ? 50 : 200);
  }
}

drive('drive_viewer', url, outdir, TIMEOUT, async (page) => {
  const result = { frames: {} };
  let f = await waitFullFrame(page, 0);
  await page.screenshot({ path: path.join(outdir, 'rgb.png') });
  result.frames.rgb = f.text;

  await inputFor(page, 'Positives').fill(query);
  f = await waitFullFrame(page, f.n, (t) => t.includes(`query: ${query}`));
  await page.screenshot({ path: path.join(outdir, 'overlay.png') });
  result.frames.overlay = f.text;

  // the heat map without the selection's points on top (they are coloured by per-Gaussian relevancy)
  await inputFor(page, 'Show selection').click({ force: true });
  f = await waitFullFrame(page, f.n, (t) => t.includes(`query: ${query}`));

  await inputFor(page, 'Output').click();
  await page.getByRole('option', { name: heatLabel, exact: true }).click();
  f = await waitFullFrame(page, f.n, (t) => t.includes(`query: ${query}`));
  await page.screenshot({ path: path.join(outdir, 'heat.png') });
  result.frames.heat = f.text;

  await page.getByRole('button', { name: 'Export selection' }).click();
  const exported = page.getByText(/Exported|Export failed/).first();
  await exported.waitFor();
  result.export = await exported.innerText();
  result.status = await page.getByText(/Selection/).first().innerText();

  // orbit the camera by dragging on the canvas: low-resolution frames while it moves, full once still
  const before = frameInfo(await infoText(page)).n;
  result.moving = [];
  await page.mouse.move(250, 400);
  await page.mouse.down();
  for (let i = 1; i <= 20; i++) {
    await page.mouse.move(250 + 12 * i, 400, { steps: 2 });
    await page.waitForTimeout(60);
    const fi = frameInfo(await infoText(page));
    if (fi && fi.n > before && !fi.full && !result.moving.includes(fi.text)) result.moving.push(fi.text);
  }
  await page.mouse.up();
  f = await waitFullFrame(page, before, () => true, result.moving);
  await page.screenshot({ path: path.join(outdir, 'moved.png') });
  result.frames.moved = f.text;

  result.panel = await panelBox(page.getByText('Text query', { exact: true }));
  result.viewport = page.viewportSize();
  console.log(JSON.stringify(result));
});
