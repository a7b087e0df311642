// Shared by the browser drivers (drive_viewer.js, drive_ns_viewer.js): headless Debian chromium
// through playwright-core (no browser download), viser's input lookup, the floating panel's box.
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');

const EXE = process.env.CHROMIUM || '/usr/bin/chromium';

// viser 0.2.7's inputs carry a label whose `for` does not match the input id, so find the
// input in the label's row instead of getByLabel.
function inputFor(page, label) {
  return page.locator(`xpath=//label[normalize-space(.)='${label}']/ancestor::div[contains(@class,'mantine-Flex-root')][1]//input`).first();
}

// The floating GUI panel holding `locator`: its highest ancestor narrower than the window.
async function panelBox(locator) {
  return locator.first().evaluate((el) => {
    let e = el;
    let best = e.getBoundingClientRect();
    while (e.parentElement && e.parentElement !== document.body) {
      e = e.parentElement;
      const r = e.getBoundingClientRect();
      if (r.width >= window.innerWidth * 0.9) break;
      best = r;
    }
    return { x: best.x, y: best.y, width: best.width, height: best.height };
  });
}

// Open `url` in headless chromium (a throwaway profile under `outdir`, 1200x700), run
// `body(page)` and close everything; a failure prints `name: error` and exits with code 1.
function drive(name, url, outdir, timeout, body) {
  (async () => {
    fs.mkdirSync(outdir, { recursive: true });
    const userDataDir = fs.mkdtempSync(path.join(outdir, 'chromium-profile-'));
    const context = await chromium.launchPersistentContext(userDataDir, {
      executablePath: EXE,
      headless: true,
      viewport: { width: 1200, height: 700 },
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
        '--disable-background-networking', '--disable-component-update', '--disable-sync',
        // WebGL (three.js canvas) through SwiftShader: recent chromium needs this opt-in without a GPU
        '--enable-unsafe-swiftshader', '--use-angle=swiftshader'],
    });
    try {
      const page = context.pages()[0] || await context.newPage();
      page.setDefaultTimeout(timeout);
      await page.goto(url);
      await body(page);
    } finally {
      await context.close();
      fs.rmSync(userDataDir, { recursive: true, force: true });
    }
  })().catch((e) => { console.error(`${name}: ${e && e.stack || e}`); process.exit(1); });
}

module.exports = { inputFor, panelBox, drive };
