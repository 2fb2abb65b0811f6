// The official sync-config compiler as a differential oracle: reads a corpus of cases (JSON on
// stdin: [{yaml, rows: [{table, columns: [[name, pg_type, text|null], ...]}], requests: [...]}]),
// evaluates each with @powersync/service-sync-rules (the version pinned in ../package.json) the
// way the official service does, and writes one result per case as JSON on stdout (whether it
// compiles, its warnings, each row's buckets, each request's buckets). The rules
// crate's differential test (worker/rules/tests/oracle) compares them with its own evaluation.
//
// Rows arrive as PostgreSQL text, decoded like the official replication (jpgwire's text
// decoding for the types the corpus uses, then toSyncRulesRow and applyRowContext); data is
// serialized with the service's JSONBig, as its storage does.
import { DatabaseSync } from 'node:sqlite';
import { JSONBig, JsonContainer } from '@powersync/service-jsonbig';
import {
  BaseJwtPayload,
  DEFAULT_HYDRATION_STATE,
  RequestParameters,
  SqlSyncRules,
  applyRowContext,
  nodeSqlite,
  toSyncRulesRow
} from '@powersync/service-sync-rules';

const SCHEMA = 'public';

/** PostgreSQL text → the value jpgwire's text decoding gives for that type. */
function decode(type, text) {
  if (text === null) return null;
  switch (type) {
    case 'int2':
    case 'int4':
    case 'int8':
    case 'oid':
      return BigInt(text);
    case 'float4':
    case 'float8':
      return Number(text);
    case 'bool':
      return text === 't';
    case 'json':
    case 'jsonb':
      return new JsonContainer(text);
    default:
      return text;
  }
}

const message = (e) => (e instanceof Error ? `${e.constructor.name}: ${e.message}` : String(e));

/** A warning's message and the text it points at: within its query when it is about SQL
 * (the whole query when the compiler gives no position), else within the YAML (a key). */
function warning(e, yaml) {
  const s = e.source;
  const inSql = s && typeof s.sql === 'string' && s.location;
  const excerpt = inSql ? s.sql.slice(s.location.start, s.location.end) : yaml.slice(e.location.start, e.location.end);
  return { message: e.message, excerpt };
}

async function evaluateCase(c) {
  const { config, errors } = SqlSyncRules.fromYaml(c.yaml, { defaultSchema: SCHEMA, throwOnError: false });
  const fatal = errors.filter((e) => e.type !== 'warning').map((e) => e.message);
  const warnings = errors.filter((e) => e.type === 'warning').map((e) => warning(e, c.yaml));
  const out = { fatal, warnings, rows: [], requests: [] };
  if (fatal.length > 0) return out;
  const hydrated = config.hydrate({ hydrationState: DEFAULT_HYDRATION_STATE, sqlite: nodeSqlite(DatabaseSync) });
  const lookups = new Map();
  for (const r of c.rows ?? []) {
    const table = { connectionTag: 'default', schema: SCHEMA, name: r.table };
    const raw = Object.fromEntries(r.columns.map(([name, type, text]) => [name, decode(type, text)]));
    const record = applyRowContext(toSyncRulesRow(raw), config.compatibility);
    const row = { puts: [], errors: [] };
    try {
      const evaluated = hydrated.evaluateRowWithErrors({ sourceTable: table, record });
      for (const p of evaluated.results) {
        row.puts.push({ bucket: p.bucket, table: p.table, id: p.id, data: JSONBig.stringify(p.data) });
      }
      row.errors.push(...evaluated.errors.map((e) => e.error));
      const params = hydrated.evaluateParameterRowWithErrors(table, record);
      for (const p of params.results) {
        const key = JSONBig.stringify(p.lookup.values);
        if (!lookups.has(key)) lookups.set(key, []);
        lookups.get(key).push(...p.bucketParameters);
      }
      row.errors.push(...params.errors.map((e) => e.error));
    } catch (e) {
      row.thrown = message(e);
    }
    out.rows.push(row);
  }
  for (const q of c.requests ?? []) {
    const streams = {};
    (q.subscriptions ?? []).forEach((s, i) => {
      (streams[s.stream] ??= []).push({ priorityOverride: s.priority ?? null, parameters: s.parameters ?? {}, opaque_id: i });
    });
    const request = { buckets: [], errors: [] };
    try {
      const globalParameters = new RequestParameters(new BaseJwtPayload(q.claims ?? {}), q.parameters ?? {});
      const { querier, errors } = hydrated.getBucketParameterQuerier({
        globalParameters,
        hasDefaultStreams: q.include_defaults ?? true,
        streams
      });
      request.errors = errors.map((e) => ({ subscription: e.subscription?.opaque_id ?? null, message: e.message }));
      const dynamic = await querier.queryDynamicBucketDescriptions({
        getParameterSets: async (wanted) =>
          wanted.map((lookup) => ({ lookup, rows: lookups.get(JSONBig.stringify(lookup.values)) ?? [] }))
      });
      for (const b of [...querier.staticBuckets, ...dynamic]) {
        const reasons = b.inclusion_reasons.map((r) => (r === 'default' ? 'default' : `sub:${r.subscription}`));
        request.buckets.push({ bucket: b.bucket, priority: b.priority, reasons });
      }
    } catch (e) {
      request.thrown = message(e);
    }
    out.requests.push(request);
  }
  return out;
}

const input = JSON.parse(await new Response(process.stdin).text());
const results = [];
for (const c of input) {
  try {
    results.push(await evaluateCase(c));
  } catch (e) {
    results.push({ thrown: message(e) });
  }
}
process.stdout.write(JSONBig.stringify(results));
