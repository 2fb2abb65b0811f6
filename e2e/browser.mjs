// End-to-end client in a real browser: bundles web/app.mjs (the official @powersync/web
// SDK) with esbuild, serves it with the SDK's prebuilt workers on a loopback port, and
// drives it in headless Chromium (puppeteer-core) until the page has synced. Prints one
// JSON line: the page's result (rows, their digest, buckets, SDK warnings) and the
// screenshot's path.
//
//   node e2e/browser.mjs
//
// Environment: PSM_ENDPOINT, PSM_JWT_SECRET + PSM_USER (or PSM_TOKEN) as for client.mjs;
// PSM_SUBSCRIBE, PSM_CONNECTION_METHOD, PSM_TIMEOUT_MS (default 30000) likewise;
// PSM_SCREENSHOT (where the page's screenshot goes, required); PSM_CHROMIUM (the browser,
// default /usr/bin/chromium: Debian's `chromium` package); PSM_BROWSER_CHANGE_SQL: after
// the first sync, this statement runs on PSM_PRIMARY_URI and the driver waits until the
// page's rows change (`after_change` in the result).
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';

import { build } from 'esbuild';
import pg from 'pg';
import puppeteer from 'puppeteer-core';

import { credentialsSource } from './lib/token.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const env = process.env;

function fail(error, extra = {}) {
  process.stdout.write(JSON.stringify({ ok: false, error: String(error?.stack ?? error), ...extra }) + '\n');
  process.exit(1);
}

const MIME = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.wasm': 'application/wasm',
  '.map': 'application/json'
};

/** The page, its bundle and the SDK's workers in a fresh directory. */
async function site() {
  const root = mkdtempSync(join(tmpdir(), 'psm-web-'));
  await build({
    entryPoints: [join(here, 'web/app.mjs')],
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'chrome120',
    outfile: join(root, 'app.js'),
    logLevel: 'error'
  });
  cpSync(join(here, 'web/index.html'), join(root, 'index.html'));
  // The SDK's prebuilt worker (SQLite and sync) with its wasm assets, as its
  // `powersync-web copy-assets` command copies them.
  cpSync(join(here, 'node_modules/@powersync/web/dist/worker'), join(root, '@powersync'), { recursive: true });
  return root;
}

/** Serves `root` and `/token` on a loopback port. */
function serve(root, credentials) {
  const server = createServer((req, res) => {
    const path = new URL(req.url, 'http://x').pathname;
    if (path === '/token') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(credentials.next());
      return;
    }
    const file = normalize(join(root, path === '/' ? 'index.html' : path));
    if (!file.startsWith(root) || !existsSync(file)) {
      res.writeHead(404);
      res.end();
      return;
    }
    res.writeHead(200, { 'content-type': MIME[extname(file)] ?? 'application/octet-stream' });
    res.end(readFileSync(file));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

/** Runs PSM_BROWSER_CHANGE_SQL on the primary (PSM_PRIMARY_URI) and waits until the
 * page's rows differ from `before`: the change streamed to the browser. */
async function followChange(page, before, timeoutMs) {
  const client = new pg.Client({ connectionString: env.PSM_PRIMARY_URI ?? fail('PSM_PRIMARY_URI is required') });
  await client.connect();
  try {
    await client.query(env.PSM_BROWSER_CHANGE_SQL);
  } finally {
    await client.end();
  }
  const was = JSON.stringify(before);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const rows = await page.evaluate(() => window.psmRows());
    if (JSON.stringify(rows) !== was) return rows;
    if (Date.now() > deadline) throw new Error(`the change did not reach the page within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function main() {
  const endpoint = env.PSM_ENDPOINT ?? fail('PSM_ENDPOINT is required');
  const screenshot = env.PSM_SCREENSHOT ?? fail('PSM_SCREENSHOT is required');
  const chromium = env.PSM_CHROMIUM ?? '/usr/bin/chromium';
  if (!existsSync(chromium)) fail(`no browser at ${chromium}: apt-get install chromium (scripts/setup.sh does)`);
  const timeoutMs = Number(env.PSM_TIMEOUT_MS ?? 30000);
  const credentials = credentialsSource(env, fail);
  const root = await site();
  const server = await serve(root, credentials);
  const query = new URLSearchParams({
    endpoint,
    subscribe: env.PSM_SUBSCRIBE ?? '',
    method: env.PSM_CONNECTION_METHOD ?? 'http',
    timeout_ms: String(timeoutMs)
  });
  const url = `http://127.0.0.1:${server.address().port}/?${query}`;
  const console = [];
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    // Root has no user namespace sandbox here; the page is the test's own.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
    userDataDir: join(root, 'profile')
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1000, height: 700 });
    page.on('console', (message) => console.push(`${message.type()}: ${message.text()}`));
    page.on('pageerror', (error) => console.push(`pageerror: ${error.message}`));
    await page.goto(url);
    await page.waitForFunction(() => window.psmResult, { timeout: timeoutMs + 5000, polling: 100 });
    const result = await page.evaluate(() => window.psmResult);
    if (result.ok && env.PSM_BROWSER_CHANGE_SQL) result.after_change = await followChange(page, result.tables.tasks, timeoutMs);
    await page.screenshot({ path: screenshot });
    const digest = result.tables
      ? createHash('sha256').update(JSON.stringify(result.tables.tasks)).digest('hex')
      : null;
    const out = { ...result, screenshot, digest_checked: digest === result.digest, browser: await browser.version(), console };
    // Written in full before the process ends (stdout to a pipe is asynchronous).
    await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
    if (!result.ok) process.exitCode = 1;
  } finally {
    await browser.close();
    server.close();
    rmSync(root, { recursive: true, force: true });
  }
}

main().catch((error) => fail(error));
