//! The sync session against the real store, consumed by a model of the client
//! (powersync-sqlite-core, `docs/spec/protocol.md` §3.4) that parses the NDJSON the session
//! encodes.
//!
//! Properties: for random row changes across checkpoints (some after forks of the
//! history), clients interrupted after every
//! prefix of a download and reconnecting with the positions they hold, and tiny paging
//! budgets, every completed checkpoint validates (checksums), the client's rows equal the
//! rows the rules give the current source rows, no op ≤ `after` or > `last_op_id` is ever
//! sent, the first line is a full checkpoint and diffs only come when something changed.
//!
//! The model of the client is in `client`; the property in `prefixes`; the topics in
//! `buckets`, `completions` and `positions`.

mod buckets;
mod client;
mod completions;
mod positions;
mod prefixes;

use std::collections::BTreeMap;
use std::sync::Arc;

use replication::StoreInput;
use rules::{OwnedSourceRow, PgType, RequestContext, SyncRules};
use serde_json::{json, Value};
use service::{BucketPosition, Budgets, Encoding, SyncLine, SyncRequest, SyncSession};
use store::Store;

use client::{Client, Truth};

const RULES: &str = r#"
bucket_definitions:
  by_list:
    priority: 1
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
  global:
    data:
      - SELECT * FROM items
  hot:
    priority: 0
    data:
      - SELECT * FROM items WHERE flag = 'hot'
"#;

/// A source change: table, id, new columns (`None`: deleted).
type Change = (&'static str, String, Option<Vec<(&'static str, String)>>);

const TABLES: [&str; 3] = ["lists", "todos", "items"];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The source database (what the rules would see) and the store replicating it.
struct Db {
    _dir: tempfile::TempDir,
    store: Store,
    rules: Arc<SyncRules>,
    /// (table, id) → columns.
    rows: BTreeMap<(&'static str, String), Vec<(&'static str, String)>>,
    lsn: u64,
}

impl Db {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        Self {
            _dir: dir,
            store,
            rules: Arc::new(SyncRules::parse(RULES).unwrap()),
            rows: BTreeMap::new(),
            lsn: 0,
        }
    }

    fn source_row(table: &str, cols: &[(&str, String)]) -> OwnedSourceRow {
        let mut row = OwnedSourceRow::new("public", table);
        for (name, value) in cols {
            row = row.column(name, PgType::from_name("text").unwrap(), Some(value));
        }
        row
    }

    /// Commits a batch of upserts (`Some(cols)`) and deletes (`None`), like the pipeline.
    fn commit(&mut self, changes: Vec<Change>) {
        self.write(changes, false);
    }

    /// [`Self::commit`] as a write of this replica alone: the history forks before its
    /// first op (`store::forks`).
    fn commit_forking(&mut self, changes: Vec<Change>) {
        self.write(changes, true);
    }

    fn write(&mut self, changes: Vec<Change>, diverge: bool) {
        self.lsn += 1;
        let rules = self.rules.clone();
        self.store
            .write(self.lsn, |w| {
                if diverge {
                    w.diverge();
                }
                for (table, id, cols) in &changes {
                    let table_id = TABLES.iter().position(|t| t == table).unwrap() as u32 + 1;
                    match cols {
                        None => {
                            w.delete_row(table_id, id.as_bytes())?;
                        }
                        Some(cols) => {
                            let row = Self::source_row(table, cols);
                            let columns = row.source_columns();
                            let eval = rules
                                .plan_for("public", table)
                                .unwrap()
                                .evaluate(&row.view(&columns))
                                .unwrap();
                            let input = StoreInput::of(&eval);
                            w.upsert_row(
                                table_id,
                                id.as_bytes(),
                                &input.memberships,
                                &input.lookup_puts(),
                            )?;
                        }
                    }
                }
                Ok(())
            })
            .unwrap();
        for (table, id, cols) in changes {
            match cols {
                None => self.rows.remove(&(table, id)),
                Some(cols) => self.rows.insert((table, id), cols),
            };
        }
    }

    /// What each bucket should hold now: bucket → (object_type, object_id) → data.
    fn truth(&self) -> Truth {
        let mut out: Truth = BTreeMap::new();
        for ((table, _), cols) in &self.rows {
            let row = Self::source_row(table, cols);
            let columns = row.source_columns();
            let eval = self
                .rules
                .plan_for("public", table)
                .unwrap()
                .evaluate(&row.view(&columns))
                .unwrap();
            for b in eval.buckets {
                out.entry(b.bucket.clone()).or_default().insert(
                    (b.object_type.to_string(), b.object_id.to_string()),
                    b.data.to_string(),
                );
            }
        }
        out
    }

    fn session(&self, positions: &[BucketPosition], budgets: Budgets) -> SyncSession {
        let request = SyncRequest::parse(b"{}").unwrap();
        let ctx: RequestContext = request.context(json!({"sub": "u1"}));
        SyncSession::new(self.rules.clone(), ctx, positions).with_budgets(budgets)
    }
}

fn cols(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}

/// Feeds lines to the client until the session is idle or `limit` lines were applied.
fn drain(
    db: &Db,
    session: &mut SyncSession,
    client: &mut Client,
    limit: usize,
    truth: Option<&Truth>,
) -> Vec<String> {
    let mut kinds = Vec::new();
    while kinds.len() < limit {
        let Some(line) = session.next_line(&db.store).unwrap() else {
            break;
        };
        kinds.push(client.apply(&line.to_bytes(Encoding::Ndjson), truth));
    }
    kinds
}

/// Announces the current checkpoint (if it is news) and applies up to `limit` lines.
fn step(
    db: &Db,
    session: &mut SyncSession,
    client: &mut Client,
    limit: usize,
    truth: Option<&Truth>,
) -> Vec<String> {
    let mut kinds = Vec::new();
    if let Some(line) = session.checkpoint(&db.store, None).unwrap() {
        kinds.push(client.apply(&line.to_bytes(Encoding::Ndjson), truth));
    }
    kinds.extend(drain(db, session, client, limit, truth));
    kinds
}

fn tiny() -> Budgets {
    Budgets {
        batch_ops: 3,
        batch_bytes: 150,
        chunk_ops: 2,
        chunk_bytes: 64,
    }
}

fn item(id: &str, flag: &str, v: &str) -> Change {
    (
        "items",
        id.into(),
        Some(cols(&[("id", id), ("flag", flag), ("v", v)])),
    )
}

fn list(id: &str, owner: &str) -> Change {
    (
        "lists",
        id.into(),
        Some(cols(&[("id", id), ("owner_id", owner)])),
    )
}

fn todo(id: &str, list: &str) -> Change {
    (
        "todos",
        id.into(),
        Some(cols(&[("id", id), ("list_id", list), ("title", "x")])),
    )
}

fn json_lines(db: &Db, session: &mut SyncSession, wc: Option<u64>) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(line) = session.checkpoint(&db.store, wc).unwrap() {
        out.push(serde_json::from_slice(&line.to_bytes(Encoding::Ndjson)).unwrap());
    }
    while let Some(line) = session.next_line(&db.store).unwrap() {
        out.push(serde_json::from_slice(&line.to_bytes(Encoding::Ndjson)).unwrap());
    }
    out
}

fn kind(v: &Value) -> &str {
    v.as_object().unwrap().keys().next().unwrap()
}
