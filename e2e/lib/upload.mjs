// uploadData's backend: applies one client CRUD transaction to the primary in one
// PostgreSQL transaction (as an app backend would), with the `pg` package.
import pg from 'pg';

const ident = (name) => pg.escapeIdentifier(name);

function statement(entry, defaults) {
  const table = ident(entry.table);
  const data = entry.opData ?? {};
  switch (entry.op) {
    case 'PUT': {
      const row = { ...(defaults[entry.table] ?? {}), ...data, id: entry.id };
      const cols = Object.keys(row);
      const updates = cols.filter((c) => c !== 'id' && c in data);
      const conflict = updates.length
        ? `DO UPDATE SET ${updates.map((c) => `${ident(c)} = EXCLUDED.${ident(c)}`).join(', ')}`
        : 'DO NOTHING';
      return {
        text: `INSERT INTO ${table} (${cols.map(ident).join(', ')}) VALUES (${cols.map((_, i) => `$${i + 1}`).join(', ')}) ON CONFLICT (id) ${conflict}`,
        values: cols.map((c) => row[c])
      };
    }
    case 'PATCH': {
      const cols = Object.keys(data);
      if (cols.length === 0) return null;
      return {
        text: `UPDATE ${table} SET ${cols.map((c, i) => `${ident(c)} = $${i + 2}`).join(', ')} WHERE id = $1`,
        values: [entry.id, ...cols.map((c) => data[c])]
      };
    }
    case 'DELETE':
      return { text: `DELETE FROM ${table} WHERE id = $1`, values: [entry.id] };
    default:
      throw new Error(`unknown CRUD op ${entry.op}`);
  }
}

export async function uploadTransaction(uri, entries, defaults) {
  if (!uri) throw new Error('PSM_PRIMARY_URI is not set: cannot upload local writes');
  if (/^https?:/.test(uri)) {
    // A stand-in app backend (e2e/selftest): the CRUD entries as JSON.
    const res = await fetch(uri, { method: 'POST', body: JSON.stringify(entries.map(({ op, table, id, opData }) => ({ op, table, id, opData }))) });
    if (!res.ok) throw new Error(`upload to ${uri} failed: ${res.status}`);
    return;
  }
  const client = new pg.Client({ connectionString: uri });
  await client.connect();
  try {
    await client.query('BEGIN');
    for (const entry of entries) {
      const s = statement(entry, defaults);
      if (s) await client.query(s);
    }
    await client.query('COMMIT');
  } catch (error) {
    await client.query('ROLLBACK').catch(() => {});
    throw error;
  } finally {
    await client.end();
  }
}
