// A minimal in-memory sync service (NDJSON, one global bucket, managed write checkpoints)
// and app backend, used only to check e2e/client.mjs itself without the real server.
// Not a reference for the protocol: the spec is docs/protocol.md.
import { createHash } from 'node:crypto';
import { createServer } from 'node:http';

const BUCKET = 'global[]';

export function startMockServer({ corruptChecksum = false, acknowledgeWrites = true } = {}) {
  const ops = []; // {op_id, op, object_id, data?, checksum}
  const rows = new Map();
  const streams = new Set();
  let writeCheckpoint = 0;
  let acknowledged = 0;
  const u32 = (text) => createHash('sha256').update(text).digest().readUInt32LE(0);

  function put(id, row) {
    rows.set(id, row);
    const data = JSON.stringify({ id, ...row });
    ops.push({ op_id: String(ops.length + 1), op: 'PUT', object_type: 'tasks', object_id: id, subkey: id, data, checksum: u32(`put.tasks.${id}.${data}`) });
  }
  function remove(id) {
    rows.delete(id);
    ops.push({ op_id: String(ops.length + 1), op: 'REMOVE', object_type: 'tasks', object_id: id, subkey: id, data: null, checksum: u32(`delete.${id}`) });
  }
  function checksum() {
    const sum = ops.reduce((s, o) => (s + o.checksum) >>> 0, 0);
    return corruptChecksum ? (sum + 1) >>> 0 : sum;
  }
  function checkpointFor(afterOp) {
    return {
      last_op_id: String(ops.length),
      ...(acknowledged ? { write_checkpoint: String(acknowledged) } : {}),
      buckets: [{ bucket: BUCKET, checksum: checksum(), count: ops.length, priority: 3, subscriptions: [{ default: 0 }] }],
      streams: [{ name: 'global', is_default: true, errors: [] }],
      _after: afterOp
    };
  }
  function send(res, line) {
    res.write(JSON.stringify(line) + '\n');
  }
  function sendCheckpoint(res, state, full) {
    const cp = checkpointFor();
    delete cp._after;
    if (full) send(res, { checkpoint: cp });
    else send(res, { checkpoint_diff: { ...cp, updated_buckets: cp.buckets, removed_buckets: [], buckets: undefined } });
    const fresh = ops.filter((o) => BigInt(o.op_id) > state.after);
    if (fresh.length) {
      send(res, { data: { bucket: BUCKET, after: String(state.after), next_after: fresh.at(-1).op_id, has_more: false, data: fresh } });
      state.after = BigInt(fresh.at(-1).op_id);
    }
    send(res, { checkpoint_complete: { last_op_id: cp.last_op_id } });
  }
  function broadcast() {
    for (const s of streams) sendCheckpoint(s.res, s.state, false);
  }

  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const url = new URL(req.url, 'http://x');
      if (req.method === 'POST' && url.pathname === '/sync/stream') {
        const request = JSON.parse(body);
        const held = (request.buckets ?? []).find((b) => b.name === BUCKET);
        const state = { after: BigInt(held?.after ?? '0') };
        server.lastRequest = request;
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        const entry = { res, state };
        streams.add(entry);
        res.on('close', () => streams.delete(entry));
        sendCheckpoint(res, state, true);
        send(res, { token_expires_in: 600 });
      } else if (req.method === 'GET' && url.pathname === '/write-checkpoint2.json') {
        writeCheckpoint += 1;
        if (acknowledgeWrites) acknowledged = writeCheckpoint; // every upload is "replicated" at once
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ data: { write_checkpoint: String(writeCheckpoint) } }));
        setTimeout(broadcast, 50);
      } else if (req.method === 'POST' && url.pathname === '/backend/crud') {
        // The app backend: applies uploaded CRUD (what uploadData sends to PostgreSQL).
        for (const e of JSON.parse(body)) {
          if (e.op === 'DELETE') remove(e.id);
          else put(e.id, { ...(e.op === 'PATCH' ? rows.get(e.id) : {}), ...e.opData });
        }
        res.writeHead(200).end('{}');
      } else {
        res.writeHead(404).end('{"error":{"code":"MOCK404"}}');
      }
    });
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () =>
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        put: (id, row) => (put(id, row), broadcast()),
        remove: (id) => (remove(id), broadcast()),
        rows: () => [...rows.entries()].map(([id, r]) => ({ id, ...r })),
        server,
        close: () => {
          for (const s of streams) s.res.destroy();
          server.closeAllConnections();
          server.close();
        }
      })
    )
  );
}
