// Drive nerfstudio's `ns-viewer` (rh3dgs text-query elements) in headless Debian chromium (playwright-core).
//
//   node drive_ns_viewer.js URL OUTDIR QUERY
//
// Steps (nerfstudio's viewer prints no frame counter: a render is "done" when the canvas stops changing):
//   1. open the page, hide the training cameras, wait for a still render       -> OUTDIR/rgb.png
//      and read the "Output type" options (options_before)
//   2. type QUERY into "Positives", wait for the selection status line of that query and for
//      relevancy_0 in "Output type" (options)
//   3. choose relevancy_0, wait for a changed, still canvas                     -> OUTDIR/relevancy.png
//   4. choose composited, wait likewise                                         -> OUTDIR/composited.png
// Prints one JSON line: {"options_before": [...], "options": [...], "status": "...", "canvas": {x, y, width, height}}.
// Exit code 1 with a message on any failure (timeouts included).
'use strict';
const path = require('path');
const { inputFor, panelBox, drive } = require('./common');

const [url, outdir, query] = process.argv.slice(2);
const TIMEOUT = Number(process.env.VIEWER_TIMEOUT_MS || 120000);

// The floating GUI panel's box and the canvas beside it.
async function canvasBox(page, label) {
  const panel = await panelBox(page.locator(`xpath=//label[normalize-space(.)='${label}']`));
  const vp = page.viewportSize();
  const right = panel.x > vp.width / 2 ? Math.floor(panel.x) - 2 : vp.width;
  const left = panel.x > vp.width / 2 ? 0 : Math.ceil(panel.x + panel.width) + 2;
  return { panel, canvas: { x: left, y: 0, width: right - left, height: vp.height } };
}

// Wait until the canvas region differs from `before` (a Buffer, or null) and then stays the same
// over `still` consecutive looks; returns the last screenshot buffer.
async function waitStill(page, clip, before, still = 4) {
  const t0 = Date.now();
  let prev = null;
  let same = 0;
  for (;;) {
    const buf = await page.screenshot({ clip });
    const changed = !before || !buf.equals(before);
    if (changed && prev && buf.equals(prev)) same += 1; else same = 0;
    if (same >= still) return buf;
    prev = buf;
    if (Date.now() - t0 > TIMEOUT) throw new Error(`canvas did not settle${before ? ' on a new image' : ''} within ${TIMEOUT} ms`);
    await page.waitForTimeout(500);
  }
}

async function outputOptions(page) {
  await inputFor(page, 'Output type').click();
  const opts = page.getByRole('option');
  await opts.first().waitFor();
  const names = (await opts.allInnerTexts()).map((s) => s.trim());
  await page.keyboard.press('Escape');
  await page.waitForTimeout(200);
  return names;
}

async function chooseOutput(page, name) {
  await inputFor(page, 'Output type').click();
  await page.getByRole('option', { name, exact: true }).click();
}

drive('drive_ns_viewer', url, outdir, TIMEOUT, async (page) => {
  const result = {};
  await inputFor(page, 'Positives').waitFor();
  const hide = page.getByRole('button', { name: 'Hide Train Cams' });
  if (await hide.count()) await hide.first().click();
  const box = await canvasBox(page, 'Positives');
  result.canvas = box.canvas;
  result.panel = box.panel;
  const clip = box.canvas;

  let shot = await waitStill(page, clip, null);
  result.options_before = await outputOptions(page);
  shot = await waitStill(page, clip, null);
  await page.screenshot({ path: path.join(outdir, 'rgb.png') });

  await inputFor(page, 'Positives').fill(query);
  const status = page.getByText(new RegExp(`Selection.*for '${query}'|Query error`)).first();
  await status.waitFor();
  result.status = await status.innerText();
  const t0 = Date.now();
  for (;;) {
    result.options = await outputOptions(page);
    if (result.options.includes('relevancy_0')) break;
    if (Date.now() - t0 > TIMEOUT) throw new Error(`relevancy_0 never appeared in Output type: ${result.options}`);
    await page.waitForTimeout(500);
  }

  await chooseOutput(page, 'relevancy_0');
  shot = await waitStill(page, clip, shot);
  await page.screenshot({ path: path.join(outdir, 'relevancy.png') });

  await chooseOutput(page, 'composited');
  shot = await waitStill(page, clip, shot);
  await page.screenshot({ path: path.join(outdir, 'composited.png') });
  result.viewport = page.viewportSize();
  console.log(JSON.stringify(result));
});
