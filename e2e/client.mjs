// End-to-end client: the official @powersync/node SDK syncing from powersync_mdbx.
//
//   node e2e/client.mjs <initial|watch>
//
// Environment:
//   PSM_ENDPOINT      http://127.0.0.1:PORT of the sync replica's HTTP server (required)
//   PSM_TOKEN         a client JWT, or
//   PSM_JWT_SECRET    base64url HS256 secret + PSM_USER: the script signs its own tokens
//                     (aud powersync-mdbx-test, kid psm-e2e, a fresh one per fetchCredentials)
//   PSM_TOKEN_TTL_S   lifetime of self-signed tokens (default 600)
//   PSM_DB_DIR        directory for the client's SQLite database (required)
//   PSM_PRIMARY_URI   libpq URI of the primary, where uploadData applies local writes
//   PSM_SUBSCRIBE     comma-separated sync streams to subscribe to (edition 3 rules)
//   PSM_CHECKPOINT_MODE  the SDK's checkpointMode: legacy (default) or requests
//   PSM_CONNECTION_METHOD  the SDK's connectionMethod: http (default) or web-socket
//   PSM_TIMEOUT_MS    deadline for the first sync and default deadline of a command's waits
//                     (default 30000; the Rust test rig sets its stall limit here)
//   PSM_MAX_CONNECT_ERRORS  consecutive sync-stream errors before the first sync that end the
//                     run (default 3; the retry delay is 500 ms)
//   PSM_DEBUG=1       echo every SDK log line to stderr
//
// stdout carries JSON lines only: `initial` prints one, `watch` prints one when the first
// sync is done and then one answer per command read from stdin (see e2e/README.md).
// Any SDK log at warn level or above that mentions a checksum or a protocol/parse problem
// fails the run: one JSON line {"ok":false,...} and exit code 1. So does a timeout.

import { createInterface } from 'node:readline';
import { mkdirSync, writeSync } from 'node:fs';

import { LogLevels, PowerSyncDatabase } from '@powersync/node';

import { schema, TABLES, SERVER_DEFAULTS } from './lib/schema.mjs';
import { credentialsSource } from './lib/token.mjs';
import { uploadTransaction } from './lib/upload.mjs';

// Log text that means the server sent something the client rejects.
const FATAL_LOG = /checksum|protocol|pars(e|ing)|decod|invalid|malformed|unexpected|bson|json/i;

const env = process.env;
const scenario = process.argv[2];
const started = Date.now();
const logs = [];
let db = null;
let finished = false;

/** Writes one JSON line to stdout synchronously, so that a following process.exit cannot
 * cut it short (stdout to a pipe is asynchronous in Node, and lines reach 100 kB). */
function out(value) {
  const buf = Buffer.from(JSON.stringify(value) + '\n');
  let offset = 0;
  while (offset < buf.length) {
    try {
      offset += writeSync(1, buf, offset);
    } catch (error) {
      if (error.code !== 'EAGAIN') throw error;
      Atomics.wait(pause, 0, 0, 5);
    }
  }
}
const pause = new Int32Array(new SharedArrayBuffer(4));

function elapsed() {
  return Date.now() - started;
}

/** Ends the run with a failure line and exit code 1. */
function fail(error, extra = {}) {
  if (finished) return;
  finished = true;
  const message = error instanceof Error ? error.message : String(error);
  out({ ok: false, scenario, error: message, elapsed_ms: elapsed(), logs, ...extra });
  process.stderr.write(`e2e client (${scenario}) failed: ${message}\n`);
  process.exit(1);
}

function required(name) {
  const value = env[name];
  if (!value) fail(`${name} is not set`);
  return value;
}

function errorText(error) {
  if (error == null) return '';
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  try {
    return typeof error === 'string' ? error : JSON.stringify(error);
  } catch {
    return String(error);
  }
}

const levelName = (level) =>
  Object.entries(LogLevels)
    .filter(([, v]) => v <= level)
    .sort((a, b) => b[1] - a[1])[0]?.[0] ?? String(level);

const logger = {
  log(record) {
    const text = [record.message, errorText(record.error)].filter(Boolean).join(' | ');
    if (env.PSM_DEBUG) process.stderr.write(`[sdk ${levelName(record.level)}] ${text}\n`);
    if (record.level < LogLevels.warn) return;
    logs.push({ level: levelName(record.level), at_ms: elapsed(), text });
    // An HTTP error status is a failed connection (counted below), not a rejected line.
    const httpStatus = /^Could not POST|HTTP [A-Z]/.test(text);
    if (FATAL_LOG.test(text) && !httpStatus) fail(`the SDK reported: ${text}`);
    if (record.level >= LogLevels.error) noteConnectError(text);
  }
};

process.on('unhandledRejection', (reason) => fail(`unhandled rejection: ${errorText(reason)}`));
process.on('uncaughtException', (error) => fail(`uncaught exception: ${errorText(error)}`));

const endpoint = required('PSM_ENDPOINT');
const dbDir = required('PSM_DB_DIR');
mkdirSync(dbDir, { recursive: true });
const credentials = credentialsSource(env, fail);
const user = env.PSM_USER ?? null;
let uploadedTransactions = 0;
let lastUploadAt = 0;

const connector = {
  async fetchCredentials() {
    return { endpoint, token: credentials.next() };
  },
  async uploadData(database) {
    for (;;) {
      const tx = await database.getNextCrudTransaction();
      if (!tx) return;
      await uploadTransaction(env.PSM_PRIMARY_URI, tx.crud, SERVER_DEFAULTS(user));
      await tx.complete();
      uploadedTransactions += 1;
      lastUploadAt = Date.now();
    }
  }
};

// Connection bookkeeping: errors before the first sync of a connection are counted so
// that a server that is not there (or answers 404) fails the run quickly.
let connectErrors = 0;
let lastDownloadError = null;
let maxProgressTotal = null;
const maxConnectErrors = Number(env.PSM_MAX_CONNECT_ERRORS ?? 3);
const connectWaiters = new Set();

// Every error the SDK logs counts; a connection waiting for its first sync gives up after
// PSM_MAX_CONNECT_ERRORS of them.
function noteConnectError(text) {
  connectErrors += 1;
  lastDownloadError = text;
  for (const waiter of connectWaiters) waiter();
}

function onStatus(status) {
  const progress = status.downloadProgress;
  if (progress) {
    maxProgressTotal = Math.max(maxProgressTotal ?? 0, progress.totalOperations);
  }
}

function statusJson() {
  const s = db.currentStatus;
  return {
    connected: s.connected,
    connecting: s.connecting,
    hasSynced: s.hasSynced ?? false,
    lastSyncedAt: s.lastSyncedAt?.toISOString() ?? null,
    downloading: s.dataFlowStatus.downloading,
    uploading: s.dataFlowStatus.uploading,
    downloadError: s.dataFlowStatus.downloadError ? errorText(s.dataFlowStatus.downloadError) : null,
    uploadError: s.dataFlowStatus.uploadError ? errorText(s.dataFlowStatus.uploadError) : null,
    streams: (s.syncStreams ?? []).map((st) => ({
      name: st.subscription.name,
      parameters: st.subscription.parameters,
      isDefault: st.subscription.isDefault,
      hasSynced: st.subscription.hasSynced,
      active: st.subscription.active
    }))
  };
}

async function rowsOf(table) {
  const rows = await db.getAll(`SELECT * FROM "${table}" ORDER BY id`);
  return rows.map((row) => Object.fromEntries(Object.keys(row).sort().map((k) => [k, row[k]])));
}

const MAX_I64 = '9223372036854775807';

/** The core's write-checkpoint state (ps_kv): the target the client waits for (MAX while
 * uploads are pending), the last one seen in a checkpoint, the last one applied. */
async function writeCheckpointState() {
  const rows = await db.getAll(
    "SELECT key, CAST(value AS TEXT) AS value FROM ps_kv WHERE key IN " +
      "('target_checkpoint_request_id', 'last_seen_checkpoint_request_id', 'last_applied_checkpoint_request_id')"
  );
  const get = (key) => rows.find((r) => r.key === key)?.value ?? null;
  return {
    target: get('target_checkpoint_request_id'),
    seen: get('last_seen_checkpoint_request_id'),
    applied: get('last_applied_checkpoint_request_id')
  };
}

async function snapshot() {
  const tables = {};
  for (const table of TABLES) tables[table] = await rowsOf(table);
  const buckets = (await db.getAll("SELECT name FROM ps_buckets WHERE name != '$local' ORDER BY name")).map(
    (r) => r.name
  );
  const local = await writeCheckpointState();
  const queue = await db.getUploadQueueStats();
  return {
    tables,
    buckets,
    write_checkpoint: local,
    upload_queue: queue.count,
    uploaded_transactions: uploadedTransactions,
    credentials_fetched: credentials.count(),
    max_progress_total: maxProgressTotal,
    status: statusJson(),
    elapsed_ms: elapsed(),
    warnings: logs
  };
}

/** Resolves when `check()` returns a truthy value; rejects after `timeoutMs`. */
async function until(what, timeoutMs, check) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const subscriptions = [];

async function connectAndSync(timeoutMs) {
  const connectStarted = Date.now();
  connectErrors = 0;
  maxProgressTotal = null;
  const abort = new AbortController();
  const failure = new Promise((_, reject) => {
    const waiter = () => {
      if (connectErrors >= maxConnectErrors) {
        reject(new Error(`sync stream failed ${connectErrors} times before the first sync: ${errorText(lastDownloadError)}`));
      }
    };
    connectWaiters.add(waiter);
    abort.signal.addEventListener('abort', () => connectWaiters.delete(waiter));
  });
  const timer = setTimeout(() => abort.abort(), timeoutMs);
  try {
    await db.connect(connector, {
      retryDelayMs: 500,
      crudUploadThrottleMs: 100,
      checkpointMode: env.PSM_CHECKPOINT_MODE ?? 'legacy',
      connectionMethod: env.PSM_CONNECTION_METHOD ?? 'http'
    });
    const names = (env.PSM_SUBSCRIBE ?? '').split(',').map((s) => s.trim()).filter(Boolean);
    if (subscriptions.length === 0) {
      for (const name of names) subscriptions.push(await db.syncStream(name).subscribe());
    }
    const synced = Promise.all([
      db.waitForFirstSync(abort.signal),
      ...subscriptions.map((sub) => sub.waitForFirstSync(abort.signal))
    ]);
    // A database that synced before resolves waitForFirstSync at once: wait for a full
    // sync on this connection too (lastSyncedAt has millisecond resolution).
    const since = connectStarted;
    const thisConnection = until('a full sync on this connection', timeoutMs, async () => {
      const s = db.currentStatus;
      return s.connected && !s.dataFlowStatus.downloading && s.lastSyncedAt && s.lastSyncedAt.getTime() >= since;
    });
    await Promise.race([Promise.all([synced, thisConnection]), failure]);
    if (abort.signal.aborted) throw new Error(`timed out after ${timeoutMs} ms waiting for the first sync`);
  } catch (error) {
    if (abort.signal.aborted && !(error instanceof Error && /failed \d+ times/.test(error.message))) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for the first sync (last error: ${errorText(lastDownloadError) || 'none'})`);
    }
    throw error;
  } finally {
    clearTimeout(timer);
    abort.abort();
  }
}

function canonical(row) {
  return JSON.stringify(Object.fromEntries(Object.keys(row).sort().map((k) => [k, row[k]])));
}

/** Differences between the client's rows and `expected` (both keyed by id). */
function diffRows(actual, expected) {
  const a = new Map(actual.map((r) => [r.id, canonical(r)]));
  const e = new Map(expected.map((r) => [r.id, canonical(r)]));
  const missing = [...e.keys()].filter((id) => !a.has(id));
  const extra = [...a.keys()].filter((id) => !e.has(id));
  const changed = [...e.keys()]
    .filter((id) => a.has(id) && a.get(id) !== e.get(id))
    .map((id) => ({ id, client: JSON.parse(a.get(id)), expected: JSON.parse(e.get(id)) }));
  return { missing, extra, changed, equal: missing.length + extra.length + changed.length === 0 };
}

function sqlValue(value) {
  return value === undefined ? null : value;
}

async function localWrite(cmd) {
  const table = cmd.table;
  if (!TABLES.includes(table)) throw new Error(`unknown table ${table}`);
  switch (cmd.cmd) {
    case 'insert': {
      const cols = Object.keys(cmd.row);
      await db.execute(
        `INSERT INTO "${table}" (${cols.map((c) => `"${c}"`).join(', ')}) VALUES (${cols.map(() => '?').join(', ')})`,
        cols.map((c) => sqlValue(cmd.row[c]))
      );
      break;
    }
    case 'update': {
      const cols = Object.keys(cmd.set);
      await db.execute(`UPDATE "${table}" SET ${cols.map((c) => `"${c}" = ?`).join(', ')} WHERE id = ?`, [
        ...cols.map((c) => sqlValue(cmd.set[c])),
        cmd.id
      ]);
      break;
    }
    case 'delete':
      await db.execute(`DELETE FROM "${table}" WHERE id = ?`, [cmd.id]);
      break;
  }
}

async function command(cmd) {
  const timeoutMs = cmd.timeout_ms ?? Number(env.PSM_TIMEOUT_MS ?? 30000);
  switch (cmd.cmd) {
    case 'dump':
      return snapshot();
    case 'bucket_ops':
      // Per bucket, what the client downloaded into it (the SDK's own bookkeeping): a
      // data line received for a bucket moves its last op.
      return {
        buckets: await db.getAll(
          "SELECT name, last_op, op_checksum, add_checksum FROM ps_buckets WHERE name != '$local' ORDER BY name"
        )
      };
    case 'raw_rows': {
      // The rows as the client keeps them: every column the service sent, also those its
      // schema does not name (the schema's views read only the named ones).
      const table = cmd.table ?? 'tasks';
      if (!TABLES.includes(table)) throw new Error(`unknown table ${table}`);
      return { rows: await db.getAll(`SELECT id, data FROM "ps_data__${table}" ORDER BY id`) };
    }
    case 'status':
      return { status: statusJson(), credentials_fetched: credentials.count(), upload_queue: (await db.getUploadQueueStats()).count };
    case 'wait_rows': {
      const table = cmd.table ?? 'tasks';
      const count = await until(`${cmd.count} rows in ${table}`, timeoutMs, async () => {
        const r = await db.get(`SELECT count(*) AS n FROM "${table}"`);
        return r.n === cmd.count ? r.n : null;
      });
      return { count };
    }
    case 'wait_equal': {
      // Waits until the client's rows of `table` are exactly `rows`; answers with the diff.
      const table = cmd.table ?? 'tasks';
      let last = null;
      try {
        await until(`${table} to equal the expected rows`, timeoutMs, async () => {
          last = diffRows(await rowsOf(table), cmd.rows);
          return last.equal;
        });
        return { equal: true, count: cmd.rows.length };
      } catch (error) {
        return { ok: false, equal: false, error: error.message, missing: last.missing, extra: last.extra, changed: last.changed.slice(0, 5), changed_count: last.changed.length };
      }
    }
    case 'wait_buckets': {
      // Waits until the client holds exactly `count` buckets (if given), names containing
      // every string of `contains`, and none containing a string of `absent`.
      let names = [];
      try {
        await until('the expected bucket set', timeoutMs, async () => {
          names = (await db.getAll("SELECT name FROM ps_buckets WHERE name != '$local'")).map((r) => r.name);
          const has = (needle) => names.some((n) => n.includes(needle));
          return (
            (cmd.count === undefined || names.length === cmd.count) &&
            (cmd.contains ?? []).every(has) &&
            !(cmd.absent ?? []).some(has)
          );
        });
        return { buckets: names.sort() };
      } catch (error) {
        return { ok: false, error: error.message, buckets: names.sort() };
      }
    }
    case 'insert':
    case 'update':
    case 'delete':
      await localWrite(cmd);
      return { upload_queue: (await db.getUploadQueueStats()).count };
    case 'wait_synced_after_upload': {
      // The local writes were uploaded (queue empty, not uploading), the client asked for
      // a write checkpoint and a later checkpoint carrying it was applied: the core's
      // write-checkpoint target is reached and a sync completed after the last upload.
      await until('the upload queue to drain and the write checkpoint to be applied', timeoutMs, async () => {
        const status = db.currentStatus;
        if (status.dataFlowStatus.uploading || !status.hasSynced) return false;
        if ((await db.getUploadQueueStats()).count !== 0) return false;
        if (lastUploadAt === 0 || !status.lastSyncedAt || status.lastSyncedAt.getTime() < lastUploadAt) return false;
        const { target, seen } = await writeCheckpointState();
        return target === null || (target !== MAX_I64 && seen !== null && BigInt(target) <= BigInt(seen));
      });
      return snapshot();
    }
    case 'request_checkpoint': {
      // checkpointMode 'requests': a checkpoint asked of the service now, applied locally.
      const request = await db.requestCheckpoint();
      await Promise.race([
        request.waitForSync(),
        new Promise((_, reject) => setTimeout(() => reject(new Error('the checkpoint request did not sync')), timeoutMs))
      ]);
      return snapshot();
    }
    case 'wait_credentials': {
      const count = await until(`${cmd.count} credential fetches`, timeoutMs, async () =>
        credentials.count() >= cmd.count && db.currentStatus.connected ? credentials.count() : null
      );
      return { credentials_fetched: count };
    }
    case 'disconnect':
      await db.disconnect();
      return { status: statusJson() };
    case 'reconnect':
      await connectAndSync(timeoutMs);
      return snapshot();
    default:
      throw new Error(`unknown command ${JSON.stringify(cmd.cmd)}`);
  }
}

async function main() {
  if (!['initial', 'watch'].includes(scenario)) {
    fail(`usage: node e2e/client.mjs <initial|watch> (got ${JSON.stringify(scenario)})`);
  }
  db = new PowerSyncDatabase({
    schema,
    logger,
    database: { dbFilename: 'e2e.db', dbLocation: dbDir, implementation: { type: 'node:sqlite' } }
  });
  db.registerListener({ statusChanged: onStatus });
  await db.init();
  await connectAndSync(Number(env.PSM_TIMEOUT_MS ?? 30000));
  const first = await snapshot();
  if (scenario === 'initial') {
    await db.disconnect();
    await db.close();
    finished = true;
    out({ ok: true, scenario, ...first });
    return;
  }
  out({ ok: true, scenario, event: 'synced', ...first });
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let cmd;
    try {
      cmd = JSON.parse(line);
    } catch {
      fail(`stdin line is not JSON: ${line}`);
    }
    try {
      const answer = await command(cmd);
      out({ ok: true, cmd: cmd.cmd, ...answer });
    } catch (error) {
      // A failed command is answered, not fatal: the test decides.
      out({ ok: false, cmd: cmd.cmd, error: errorText(error), status: statusJson(), warnings: logs });
    }
  }
  await db.disconnect();
  await db.close();
  finished = true;
}

main().then(
  () => process.exit(0),
  (error) => fail(error)
);
