// The browser page's app: the official @powersync/web SDK (SQLite in a web worker, sync in
// a shared worker) syncing from a sync replica. Bundled by e2e/browser.mjs with esbuild and
// driven in headless Chromium. It reads its setup from the query string (`endpoint`,
// `subscribe`, `method`, `timeout_ms`), fetches tokens from the page's own server
// (`/token`: the driver signs them), and leaves its result in `window.psmResult`; it stays
// connected, and `window.psmRows()` reads the synced rows again.
import { LogLevels, PowerSyncDatabase, Schema, Table, column } from '@powersync/web';

import { buildSchema, TABLES } from '../lib/columns.mjs';

const params = new URLSearchParams(location.search);
const endpoint = params.get('endpoint');
const subscribe = (params.get('subscribe') ?? '').split(',').filter(Boolean);
const method = params.get('method') ?? 'http';
const timeoutMs = Number(params.get('timeout_ms') ?? 30000);
const started = performance.now();
const warnings = [];
let tokensFetched = 0;

const show = (text) => {
  document.getElementById('status').textContent = text;
};

const logger = {
  log(record) {
    if (record.level < LogLevels.warn) return;
    const error = record.error ? ` | ${record.error?.message ?? String(record.error)}` : '';
    warnings.push({ at_ms: Math.round(performance.now() - started), text: `${record.message}${error}` });
  }
};

const connector = {
  async fetchCredentials() {
    const response = await fetch('/token');
    if (!response.ok) throw new Error(`the page's /token answered ${response.status}`);
    tokensFetched += 1;
    return { endpoint, token: await response.text() };
  },
  async uploadData() {}
};

/** SHA-256 (hex) of the rows as canonical JSON: the same digest e2e/browser.mjs computes. */
async function digest(rows) {
  const bytes = new TextEncoder().encode(JSON.stringify(rows));
  const hash = await crypto.subtle.digest('SHA-256', bytes);
  return [...new Uint8Array(hash)].map((b) => b.toString(16).padStart(2, '0')).join('');
}

function render(rows) {
  const table = document.getElementById('rows');
  const names = ['id', 'title', 'status', 'priority'];
  table.innerHTML = `<tr>${names.map((n) => `<th>${n}</th>`).join('')}</tr>`;
  for (const row of rows.slice(0, 15)) {
    const tr = document.createElement('tr');
    for (const name of names) {
      const td = document.createElement('td');
      td.textContent = String(row[name] ?? '');
      tr.appendChild(td);
    }
    table.appendChild(tr);
  }
}

async function run() {
  if (!endpoint) throw new Error('no endpoint in the query string');
  const db = new PowerSyncDatabase({
    schema: buildSchema({ Schema, Table, column }),
    logger,
    database: { dbFilename: 'psm-web.db', worker: '/@powersync/worker.js' },
    sync: { worker: '/@powersync/worker.js' }
  });
  await db.init();
  show('connecting…');
  const deadline = new Promise((_, reject) =>
    setTimeout(() => reject(new Error(`no first sync within ${timeoutMs} ms`)), timeoutMs)
  );
  await db.connect(connector, { connectionMethod: method });
  const subscriptions = [];
  for (const name of subscribe) subscriptions.push(await db.syncStream(name).subscribe());
  await Promise.race([
    Promise.all([db.waitForFirstSync(), ...subscriptions.map((s) => s.waitForFirstSync())]),
    deadline
  ]);
  const rowsOf = async (name) =>
    (await db.getAll(`SELECT * FROM "${name}" ORDER BY id`)).map((row) =>
      Object.fromEntries(Object.keys(row).sort().map((k) => [k, row[k]]))
    );
  // The driver reads the rows again after it changed the primary (the sync goes on).
  window.psmRows = () => rowsOf('tasks');
  const tables = {};
  for (const name of TABLES) tables[name] = await rowsOf(name);
  const buckets = (await db.getAll("SELECT name FROM ps_buckets WHERE name != '$local' ORDER BY name")).map(
    (r) => r.name
  );
  const status = db.currentStatus;
  const result = {
    ok: true,
    tables,
    digest: await digest(tables.tasks),
    buckets,
    connected: status.connected,
    has_synced: status.hasSynced ?? false,
    tokens_fetched: tokensFetched,
    elapsed_ms: Math.round(performance.now() - started),
    user_agent: navigator.userAgent,
    warnings
  };
  render(tables.tasks);
  show(`synced ${tables.tasks.length} tasks from ${endpoint} in ${result.elapsed_ms} ms — digest ${result.digest.slice(0, 16)}`);
  return result;
}

run().then(
  (result) => {
    window.psmResult = result;
  },
  (error) => {
    show(`failed: ${error?.message ?? error}`);
    window.psmResult = { ok: false, error: String(error?.stack ?? error), warnings };
  }
);
