// Checks e2e/client.mjs against the in-memory mock service (not the real server):
//   e2e/node_modules/.bin/node e2e/selftest/run.mjs
// Prints `N passed, N failed`.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { startMockServer } from './mock-server.mjs';

const client = fileURLToPath(new URL('../client.mjs', import.meta.url));
let passed = 0;
let failed = 0;
// Client databases of this run, removed when it ends.
const dirs = [];
process.on('exit', () => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

function dbDir() {
  const dir = mkdtempSync(join(tmpdir(), 'psm-e2e-selftest-'));
  dirs.push(dir);
  return dir;
}

function env(mock, extra = {}) {
  return {
    ...process.env,
    PSM_ENDPOINT: mock.url,
    PSM_JWT_SECRET: Buffer.from('selftest-secret').toString('base64url'),
    PSM_USER: 'user-1',
    PSM_DB_DIR: dbDir(),
    PSM_PRIMARY_URI: `${mock.url}/backend/crud`,
    PSM_TIMEOUT_MS: '8000',
    ...extra
  };
}

function watch(environment) {
  const child = spawn(process.execPath, [client, 'watch'], { env: environment, stdio: ['pipe', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async () => JSON.parse((await lines.next()).value);
  return {
    next,
    async send(cmd) {
      child.stdin.write(JSON.stringify(cmd) + '\n');
      return next();
    },
    async end() {
      child.stdin.end();
      return new Promise((r) => child.on('exit', r));
    }
  };
}

function run(environment, scenario) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [client, scenario], { env: environment, stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    child.stdout.on('data', (c) => (out += c));
    child.on('exit', (code) => resolve({ code, line: JSON.parse(out.trim().split('\n').at(-1)) }));
  });
}

async function check(name, fn) {
  try {
    await fn();
    passed += 1;
    console.log(`ok - ${name}`);
  } catch (error) {
    failed += 1;
    console.log(`not ok - ${name}: ${error.stack}`);
  }
}

function assert(condition, message) {
  if (!condition) throw new Error(message);
}

const row = (n) => ({ org_id: 'o', project_id: 'p', title: `t${n}`, status: 'todo', priority: n, assignee_id: 'a', story_points: 1, updated_at: '2026-01-01 00:00:00Z', summary: 's' });
const sorted = (rows) => [...rows].sort((a, b) => (a.id < b.id ? -1 : 1)).map((r) => Object.fromEntries(Object.keys(r).sort().map((k) => [k, r[k]])));

await check('initial sync dumps the rows', async () => {
  const mock = await startMockServer();
  mock.put('a', row(1));
  mock.put('b', row(2));
  const { code, line } = await run(env(mock), 'initial');
  mock.close();
  assert(code === 0 && line.ok, JSON.stringify(line));
  assert(JSON.stringify(line.tables.tasks) === JSON.stringify(sorted(mock.rows())), JSON.stringify(line.tables));
  assert(line.buckets.length === 1 && line.status.hasSynced && line.warnings.length === 0, JSON.stringify(line));
});

await check('a checksum mismatch fails the run', async () => {
  const mock = await startMockServer({ corruptChecksum: true });
  mock.put('a', row(1));
  const { code, line } = await run(env(mock), 'initial');
  mock.close();
  assert(code === 1 && !line.ok && /checksum/i.test(line.error), JSON.stringify(line));
});

await check('a missing endpoint fails quickly', async () => {
  const mock = await startMockServer();
  const started = Date.now();
  const { code, line } = await run(env(mock, { PSM_ENDPOINT: `${mock.url}/nothing` }), 'initial');
  mock.close();
  assert(code === 1 && /failed \d+ times/.test(line.error) && Date.now() - started < 6000, JSON.stringify(line));
});

await check('watch: changes, local writes with a write checkpoint, reconnect', async () => {
  const mock = await startMockServer();
  mock.put('a', row(1));
  const c = watch(env(mock));
  const first = await c.next();
  assert(first.ok && first.tables.tasks.length === 1, JSON.stringify(first));
  mock.put('b', row(2));
  mock.remove('a');
  let answer = await c.send({ cmd: 'wait_equal', table: 'tasks', rows: sorted(mock.rows()), timeout_ms: 5000 });
  assert(answer.ok, JSON.stringify(answer));
  assert((await c.send({ cmd: 'insert', table: 'tasks', row: { id: 'local', ...row(3) } })).ok, 'insert');
  assert((await c.send({ cmd: 'update', table: 'tasks', id: 'b', set: { title: 'changed' } })).ok, 'update');
  answer = await c.send({ cmd: 'wait_synced_after_upload', timeout_ms: 8000 });
  assert(answer.ok && answer.upload_queue === 0 && answer.uploaded_transactions === 2, JSON.stringify(answer));
  console.log(`  write checkpoint state after the upload: ${JSON.stringify(answer.write_checkpoint)}`);
  assert(JSON.stringify(answer.tables.tasks) === JSON.stringify(sorted(mock.rows())), JSON.stringify(answer.tables));
  assert((await c.send({ cmd: 'disconnect' })).ok, 'disconnect');
  mock.put('c', row(4));
  answer = await c.send({ cmd: 'reconnect', timeout_ms: 5000 });
  console.log(`  reconnect: max_progress_total ${answer.max_progress_total}, first sync: ${first.max_progress_total}`);
  assert(answer.ok, JSON.stringify(answer));
  answer = await c.send({ cmd: 'wait_equal', table: 'tasks', rows: sorted(mock.rows()), timeout_ms: 5000 });
  assert(answer.ok, JSON.stringify(answer));
  const buckets = mock.server.lastRequest.buckets;
  assert(buckets.length === 1 && buckets[0].after !== '0', `reconnect resumes: ${JSON.stringify(buckets)}`);
  const last = await c.send({ cmd: 'dump' });
  assert(last.warnings.length === 0, JSON.stringify(last.warnings));
  const code = await c.end();
  mock.close();
  assert(code === 0, `exit ${code}`);
});

await check('without a write checkpoint in the stream, uploads are never acknowledged', async () => {
  const mock = await startMockServer({ acknowledgeWrites: false });
  mock.put('a', row(1));
  const c = watch(env(mock));
  assert((await c.next()).ok, 'first sync');
  await c.send({ cmd: 'insert', table: 'tasks', row: { id: 'local', ...row(3) } });
  const answer = await c.send({ cmd: 'wait_synced_after_upload', timeout_ms: 3000 });
  assert(!answer.ok && /timed out/.test(answer.error), JSON.stringify(answer));
  const dump = await c.send({ cmd: 'dump' });
  assert(dump.write_checkpoint.target !== null && dump.upload_queue === 0, JSON.stringify(dump.write_checkpoint));
  await c.end();
  mock.close();
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
