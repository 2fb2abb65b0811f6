//! The sync session against the real store, consumed by a model of the client
//! (powersync-sqlite-core, spec §3.4) that parses the NDJSON the session encodes.
//!
//! Properties: for random row changes across checkpoints (some after forks of the
//! history), clients interrupted after every
//! prefix of a download and reconnecting with the positions they hold, and tiny paging
//! budgets, every completed checkpoint validates (checksums), the client's rows equal the
//! rows the rules give the current source rows, no op ≤ `after` or > `last_op_id` is ever
//! sent, the first line is a full checkpoint and diffs only come when something changed.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use replication::StoreInput;
use rules::{OwnedSourceRow, PgType, RequestContext, SyncRules};
use serde_json::{json, Value};
use service::{BucketPosition, Budgets, Encoding, SyncLine, SyncRequest, SyncSession};
use store::Store;

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
/// Bucket → (object_type, object_id) → data.
type Truth = BTreeMap<String, BTreeMap<(String, String), String>>;

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

/// One bucket as the client holds it.
#[derive(Debug, Clone, Default)]
struct ClientBucket {
    /// Row key → (op id, checksum, object_type, object_id, data).
    ops: BTreeMap<String, (u64, u32, String, String, String)>,
    add: u32,
    op: u32,
    last_op: u64,
}

/// The client's view of the checkpoint it is downloading.
#[derive(Debug, Clone, Default)]
struct Target {
    last_op_id: u64,
    write_checkpoint: Option<u64>,
    /// name → (checksum as u32, count, priority).
    buckets: HashMap<String, (u32, u64, u8)>,
}

#[derive(Debug, Clone, Default)]
struct Client {
    buckets: BTreeMap<String, ClientBucket>,
    target: Option<Target>,
    /// A line was seen on this connection.
    connected: bool,
    completions: usize,
    validated_at: Option<u64>,
}

fn op_id(v: &Value) -> u64 {
    v.as_str().expect("op ids are strings").parse().unwrap()
}

fn checksum(v: &Value) -> u32 {
    let n = v.as_i64().expect("checksums are integers");
    assert!(
        (-(1 << 31)..(1 << 32)).contains(&n),
        "checksum {n} out of range"
    );
    n as u32
}

impl Client {
    fn positions(&self) -> Vec<BucketPosition> {
        self.buckets
            .iter()
            .map(|(name, b)| BucketPosition {
                name: name.clone(),
                after: b.last_op,
            })
            .collect()
    }

    /// A new connection: the server's first line must be a full checkpoint.
    fn reconnect(&mut self) {
        self.connected = false;
        self.target = None;
    }

    fn apply_bucket_entry(target: &mut Target, b: &Value) {
        let name = b["bucket"].as_str().unwrap().to_string();
        let priority = b["priority"].as_u64().unwrap() as u8;
        for reason in b["subscriptions"].as_array().unwrap() {
            let o = reason.as_object().unwrap();
            assert_eq!(o.len(), 1);
            assert!(o.contains_key("default") || o.contains_key("sub"));
        }
        target.buckets.insert(
            name,
            (
                checksum(&b["checksum"]),
                b["count"].as_u64().unwrap(),
                priority,
            ),
        );
    }

    /// Applies one NDJSON line; returns the line type.
    fn apply(&mut self, bytes: &[u8], truth: Option<&Truth>) -> String {
        assert_eq!(bytes.last(), Some(&b'\n'));
        let v: Value = serde_json::from_slice(bytes).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 1, "one top-level key");
        let (kind, body) = obj.iter().next().unwrap();
        match kind.as_str() {
            "checkpoint" => {
                assert!(
                    !self.connected,
                    "a full checkpoint only opens the connection here"
                );
                let mut t = Target {
                    last_op_id: op_id(&body["last_op_id"]),
                    write_checkpoint: body.get("write_checkpoint").map(op_id),
                    ..Default::default()
                };
                for b in body["buckets"].as_array().unwrap() {
                    Self::apply_bucket_entry(&mut t, b);
                }
                self.buckets.retain(|name, _| t.buckets.contains_key(name));
                self.target = Some(t);
            }
            "checkpoint_diff" => {
                assert!(self.connected, "a diff before the first checkpoint");
                let t = self.target.as_mut().unwrap();
                let removed = body["removed_buckets"].as_array().unwrap();
                let updated = body["updated_buckets"].as_array().unwrap();
                let wc = body.get("write_checkpoint").map(op_id);
                assert!(
                    !removed.is_empty() || !updated.is_empty() || wc != t.write_checkpoint,
                    "a diff that changes nothing"
                );
                t.last_op_id = op_id(&body["last_op_id"]);
                t.write_checkpoint = wc;
                for r in removed {
                    let name = r.as_str().unwrap();
                    t.buckets.remove(name);
                    self.buckets.remove(name);
                }
                for b in updated {
                    Self::apply_bucket_entry(t, b);
                }
            }
            "data" => {
                let t = self.target.as_ref().expect("data before a checkpoint");
                let name = body["bucket"].as_str().unwrap();
                assert!(
                    t.buckets.contains_key(name),
                    "data for a bucket not in the checkpoint"
                );
                let bucket = self.buckets.entry(name.to_string()).or_default();
                let ops = body["data"].as_array().unwrap();
                assert!(!ops.is_empty(), "empty data line");
                if ops[0]["op"] == "CLEAR" {
                    // A CLEAR empties the bucket whatever the client held (the core does
                    // not compare `after` either): a download from 0 may follow it.
                    bucket.last_op = 0;
                } else {
                    assert_eq!(
                        op_id(&body["after"]),
                        bucket.last_op,
                        "chunk starts where the client is"
                    );
                }
                for (i, op) in ops.iter().enumerate() {
                    let id = op_id(&op["op_id"]);
                    assert!(
                        id > bucket.last_op || (i == 0 && op["op"] == "CLEAR"),
                        "op {id} ≤ after {} in {name}",
                        bucket.last_op
                    );
                    assert!(
                        id <= t.last_op_id,
                        "op {id} beyond the checkpoint {}",
                        t.last_op_id
                    );
                    let c = checksum(&op["checksum"]);
                    let key = || {
                        format!(
                            "{}/{}/{}",
                            op["object_type"].as_str().unwrap(),
                            op["object_id"].as_str().unwrap(),
                            op["subkey"].as_str().unwrap()
                        )
                    };
                    match op["op"].as_str().unwrap() {
                        "PUT" => {
                            let data = op["data"].as_str().expect("data is a string").to_string();
                            if let Some(old) = bucket.ops.remove(&key()) {
                                bucket.add = bucket.add.wrapping_add(old.1);
                                bucket.op = bucket.op.wrapping_sub(old.1);
                            }
                            let (ty, oid) = (
                                op["object_type"].as_str().unwrap(),
                                op["object_id"].as_str().unwrap(),
                            );
                            bucket
                                .ops
                                .insert(key(), (id, c, ty.into(), oid.into(), data));
                            bucket.op = bucket.op.wrapping_add(c);
                        }
                        "REMOVE" => {
                            assert!(op.get("data").is_none());
                            if let Some(old) = bucket.ops.remove(&key()) {
                                bucket.add = bucket.add.wrapping_add(old.1);
                                bucket.op = bucket.op.wrapping_sub(old.1);
                            }
                            bucket.add = bucket.add.wrapping_add(c);
                        }
                        "MOVE" => {
                            assert_eq!(
                                op.as_object().unwrap().len(),
                                3,
                                "MOVE has no object fields"
                            );
                            bucket.add = bucket.add.wrapping_add(c);
                        }
                        "CLEAR" => {
                            bucket.ops.clear();
                            bucket.add = c;
                            bucket.op = 0;
                        }
                        other => panic!("op {other}"),
                    }
                    bucket.last_op = id;
                }
                assert_eq!(op_id(&body["next_after"]), bucket.last_op);
            }
            "checkpoint_complete" | "partial_checkpoint_complete" => {
                let t = self
                    .target
                    .as_ref()
                    .expect("completion before a checkpoint");
                assert_eq!(op_id(&body["last_op_id"]), t.last_op_id);
                let limit = body.get("priority").map(|p| p.as_u64().unwrap() as u8);
                for (name, (sum, _, priority)) in &t.buckets {
                    if limit.is_some_and(|p| *priority > p) {
                        continue;
                    }
                    let b = self.buckets.entry(name.clone()).or_default();
                    assert_eq!(
                        b.add.wrapping_add(b.op),
                        *sum,
                        "checksum of {name} at {} ({kind})",
                        t.last_op_id
                    );
                    b.last_op = t.last_op_id;
                    if let Some(truth) = truth.filter(|_| limit.is_none()) {
                        let held: BTreeMap<(String, String), String> = b
                            .ops
                            .values()
                            .map(|(_, _, ty, id, data)| ((ty.clone(), id.clone()), data.clone()))
                            .collect();
                        assert_eq!(
                            &held,
                            truth.get(name).unwrap_or(&BTreeMap::new()),
                            "rows of {name}"
                        );
                    }
                }
                if limit.is_none() {
                    self.completions += 1;
                    self.validated_at = Some(t.last_op_id);
                }
            }
            other => panic!("unexpected line {other}"),
        }
        self.connected = true;
        kind.clone()
    }
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

fn random_change(db: &Db, rng: &mut Rng) -> Change {
    let _ = db;
    let id = rng.below(6).to_string();
    if rng.below(5) == 0 {
        let table = TABLES[rng.below(3) as usize];
        return (table, id, None);
    }
    match rng.below(3) {
        0 => {
            let owner = if rng.below(3) == 0 { "u2" } else { "u1" };
            (
                "lists",
                id.clone(),
                Some(cols(&[("id", &format!("L{id}")), ("owner_id", owner)])),
            )
        }
        1 => {
            let list = format!("L{}", rng.below(6));
            let title = format!("t{}", rng.below(100));
            (
                "todos",
                id.clone(),
                Some(cols(&[("id", &id), ("list_id", &list), ("title", &title)])),
            )
        }
        _ => {
            let flag = if rng.below(2) == 0 { "hot" } else { "cold" };
            let v = rng.below(1000).to_string();
            (
                "items",
                id.clone(),
                Some(cols(&[("id", &id), ("flag", flag), ("v", &v)])),
            )
        }
    }
}

fn tiny() -> Budgets {
    Budgets {
        batch_ops: 3,
        batch_bytes: 150,
        chunk_ops: 2,
        chunk_bytes: 64,
    }
}

fn run(seed: u64) {
    let mut db = Db::new();
    let mut rng = Rng(seed);
    let mut live_client = Client::default();
    let mut live = db.session(&[], tiny());
    for round in 0..14 {
        for _ in 0..=rng.below(2) {
            let changes = (0..=rng.below(4))
                .map(|_| random_change(&db, &mut rng))
                .collect();
            // Now and then a write of this replica alone: op ids jump past a fork.
            if rng.below(5) == 0 {
                db.commit_forking(changes);
            } else {
                db.commit(changes);
            }
        }
        let truth = db.truth();
        // The connected client sometimes takes only part of a download before the next
        // checkpoint arrives (superseding it).
        let limit = if rng.below(3) == 0 {
            rng.below(4) as usize
        } else {
            usize::MAX
        };
        step(&db, &mut live, &mut live_client, limit, Some(&truth));
        // A client that disconnects after every prefix of a fresh download and reconnects
        // with the positions it holds ends validated with exactly the current rows.
        let base = live_client.clone();
        let mut probe = base.clone();
        probe.reconnect();
        let mut s = db.session(&base.positions(), tiny());
        let full = step(&db, &mut s, &mut probe, usize::MAX, Some(&truth));
        assert_eq!(
            full.first().map(String::as_str),
            Some("checkpoint"),
            "first line"
        );
        assert_eq!(full.last().map(String::as_str), Some("checkpoint_complete"));
        let every = round == 13 || rng.below(2) == 0;
        let prefixes: Vec<usize> = if every {
            (0..full.len()).collect()
        } else {
            vec![rng.below(full.len() as u64) as usize]
        };
        for k in prefixes {
            let mut c = base.clone();
            c.reconnect();
            let mut s = db.session(&c.positions(), tiny());
            step(&db, &mut s, &mut c, k, Some(&truth));
            c.reconnect();
            let mut s = db.session(&c.positions(), tiny());
            let before = c.completions;
            step(&db, &mut s, &mut c, usize::MAX, Some(&truth));
            assert_eq!(
                c.completions,
                before + 1,
                "seed {seed} round {round} prefix {k}: completes"
            );
            // Nothing changed: no line at all.
            assert!(s.checkpoint(&db.store, None).unwrap().is_none());
        }
    }
    // Finally the live client catches up and is complete.
    let truth = db.truth();
    db.commit(vec![(
        "items",
        "99".into(),
        Some(cols(&[("id", "99"), ("flag", "hot"), ("v", "1")])),
    )]);
    let truth_after = db.truth();
    let _ = truth;
    let kinds = step(
        &db,
        &mut live,
        &mut live_client,
        usize::MAX,
        Some(&truth_after),
    );
    assert_eq!(kinds.first().map(String::as_str), Some("checkpoint_diff"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert!(live.checkpoint(&db.store, None).unwrap().is_none());
}

#[test]
fn clients_at_every_prefix_validate_with_the_current_rows() {
    for seed in [3, 11, 2024, 0xdead_beef, 77_777] {
        run(seed);
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

#[test]
fn priority_groups_complete_in_order_with_partial_completions() {
    let mut db = Db::new();
    db.commit(vec![
        item("1", "hot", "a"),
        item("2", "cold", "b"),
        list("L1", "u1"),
        todo("t1", "L1"),
    ]);
    let mut s = db.session(&[], Budgets::default());
    let lines = json_lines(&db, &mut s, None);
    let kinds: Vec<&str> = lines.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "checkpoint",
            "data",
            "partial_checkpoint_complete",
            "data",
            "partial_checkpoint_complete",
            "data",
            "checkpoint_complete"
        ]
    );
    assert_eq!(lines[1]["data"]["bucket"], "1#hot[]");
    assert_eq!(lines[2]["partial_checkpoint_complete"]["priority"], 0);
    assert_eq!(lines[3]["data"]["bucket"], "1#by_list[\"L1\"]");
    assert_eq!(lines[4]["partial_checkpoint_complete"]["priority"], 1);
    assert_eq!(lines[5]["data"]["bucket"], "1#global[]");
    let cp = &lines[0]["checkpoint"];
    let names: Vec<&str> = cp["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["by_list", "global", "hot"]);
    let hot = cp["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"] == "1#hot[]")
        .unwrap();
    assert_eq!(hot["subscriptions"], json!([{"default": 2}]));
    assert_eq!(hot["priority"], 0);
    // Nothing new: no line; a write checkpoint alone: an empty diff and its completion.
    assert!(s.checkpoint(&db.store, None).unwrap().is_none());
    let lines = json_lines(&db, &mut s, Some(7));
    assert_eq!(
        lines[0],
        json!({"checkpoint_diff": {"last_op_id": cp["last_op_id"], "write_checkpoint": "7",
            "updated_buckets": [], "removed_buckets": []}})
    );
    assert_eq!(lines.len(), 2);
    assert_eq!(kind(&lines[1]), "checkpoint_complete");
}

#[test]
fn a_parameter_row_adds_and_removes_a_bucket() {
    let mut db = Db::new();
    db.commit(vec![
        item("1", "cold", "a"),
        todo("t1", "L1"),
        todo("t2", "L1"),
    ]);
    let mut s = db.session(&[], Budgets::default());
    let mut client = Client::default();
    step(&db, &mut s, &mut client, usize::MAX, Some(&db.truth()));
    assert!(!client.buckets.contains_key("1#by_list[\"L1\"]"));
    // The list becomes u1's: its bucket joins with its whole history.
    db.commit(vec![list("L1", "u1")]);
    let lines = json_lines(&db, &mut s, None);
    let diff = &lines[0]["checkpoint_diff"];
    assert_eq!(diff["updated_buckets"][0]["bucket"], "1#by_list[\"L1\"]");
    assert_eq!(diff["updated_buckets"][0]["count"], 2);
    assert_eq!(lines[1]["data"]["after"], "0");
    assert_eq!(lines[1]["data"]["data"].as_array().unwrap().len(), 2);
    assert_eq!(s.position("1#by_list[\"L1\"]"), s.last_op_id());
    // It goes to someone else: removed, position dropped.
    db.commit(vec![list("L1", "u2")]);
    let lines = json_lines(&db, &mut s, None);
    assert_eq!(
        lines[0]["checkpoint_diff"]["removed_buckets"],
        json!(["1#by_list[\"L1\"]"])
    );
    assert_eq!(lines[0]["checkpoint_diff"]["updated_buckets"], json!([]));
    assert_eq!(kind(&lines[1]), "checkpoint_complete");
    assert_eq!(s.position("1#by_list[\"L1\"]"), None);
    // And back: it starts again from 0.
    db.commit(vec![list("L1", "u1")]);
    let lines = json_lines(&db, &mut s, None);
    assert_eq!(lines[1]["data"]["after"], "0");
    assert_eq!(lines[1]["data"]["data"].as_array().unwrap().len(), 2);
}

/// `rows` rows of the `cold` bucket, a session that announced its first checkpoint, then
/// row 1 changed before any data was handed out: the lines the rest of that checkpoint
/// gives.
fn change_after_the_first_checkpoint(rows: usize) -> (Db, SyncSession, Client, Vec<String>) {
    let mut db = Db::new();
    db.commit(
        (1..=rows)
            .map(|i| item(&i.to_string(), "cold", "a"))
            .collect(),
    );
    let mut s = db.session(&[], Budgets::default());
    let mut client = Client::default();
    let first = s.checkpoint(&db.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    db.commit(vec![item("1", "cold", "changed")]);
    let kinds = drain(&db, &mut s, &mut client, usize::MAX, None);
    (db, s, client, kinds)
}

#[test]
fn a_move_beyond_the_checkpoint_withholds_its_completion() {
    // More ops than a small download: its data is read after the checkpoint's own read,
    // and row 1's PUT has become a MOVE targeting a newer op by then.
    let (db, mut s, mut client, kinds) = change_after_the_first_checkpoint(300);
    assert_eq!(
        kinds,
        ["data"],
        "no completion for the invalidated checkpoint"
    );
    assert!(!s.is_downloading());
    let truth = db.truth();
    let kinds = step(&db, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds, ["checkpoint_diff", "data", "checkpoint_complete"]);
    assert_eq!(client.completions, 1);
}

#[test]
fn a_compaction_past_the_checkpoint_withholds_its_completion() {
    // 300 rows; the client takes the first of the first checkpoint's data lines.
    let every_row =
        |v: &str| -> Vec<Change> { (1..=300).map(|i| item(&i.to_string(), "cold", v)).collect() };
    let mut db = Db::new();
    db.commit(every_row("a"));
    let mut s = db.session(&[], tiny());
    let mut client = Client::default();
    assert_eq!(
        step(&db, &mut s, &mut client, 1, None),
        ["checkpoint", "data"]
    );
    // Every row updated twice, then the bucket compacted: the ops up to the checkpoint
    // and the first update's are folded into one CLEAR past the checkpoint, so the rest
    // of the download finds none of the ops it was to send.
    db.commit(every_row("b"));
    db.commit(every_row("c"));
    let id = db
        .store
        .read(|v| Ok(v.bucket("1#global[]")?.unwrap().id))
        .unwrap();
    let (folded, _) = db.store.write(db.lsn, |w| w.compact_bucket(id)).unwrap();
    assert_eq!(folded, 599);
    let kinds = drain(&db, &mut s, &mut client, usize::MAX, None);
    assert!(
        !kinds.iter().any(|k| k == "checkpoint_complete"),
        "no completion for a checkpoint whose ops were folded past it: {kinds:?}"
    );
    let truth = db.truth();
    let kinds = step(&db, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds.first().map(String::as_str), Some("checkpoint_diff"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert_eq!(client.completions, 1);
}

#[test]
fn a_small_download_is_read_with_its_checkpoint() {
    // Two ops, read in the checkpoint's own view: the checkpoint completes with exactly
    // what it announced, whatever changed after.
    let (db, mut s, mut client, kinds) = change_after_the_first_checkpoint(2);
    assert_eq!(kinds, ["data", "checkpoint_complete"]);
    assert_eq!(client.completions, 1);
    let truth = db.truth();
    let kinds = step(&db, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds, ["checkpoint_diff", "data", "checkpoint_complete"]);
    assert_eq!(client.completions, 2);
}

#[test]
fn positions_beyond_the_checkpoint_restart_and_unknown_buckets_are_ignored() {
    let mut db = Db::new();
    db.commit(vec![item("1", "cold", "a"), item("2", "hot", "b")]);
    let positions = [
        BucketPosition {
            name: "1#global[]".into(),
            after: 999,
        },
        BucketPosition {
            name: "1#nope[]".into(),
            after: 1,
        },
        BucketPosition {
            name: "1#hot[]".into(),
            after: 3,
        },
    ];
    let mut s = db
        .session(&positions, Budgets::default())
        .with_catch_up_hold(std::time::Duration::ZERO);
    let lines = json_lines(&db, &mut s, None);
    let cp = &lines[0]["checkpoint"];
    assert!(!cp.to_string().contains("nope"));
    assert_eq!(cp["last_op_id"], "3");
    let global: Vec<&Value> = lines
        .iter()
        .filter(|l| l["data"]["bucket"] == "1#global[]")
        .collect();
    assert_eq!(global.len(), 1);
    assert_eq!(
        global[0]["data"]["after"], "0",
        "a position above the head restarts"
    );
    assert!(
        !lines.iter().any(|l| l["data"]["bucket"] == "1#hot[]"),
        "hot is complete at its position"
    );
    assert_eq!(kind(lines.last().unwrap()), "checkpoint_complete");
}

#[test]
fn a_client_further_along_is_held_until_the_store_catches_up() {
    // A client that synced from a peer of the same history up to op 3 reconnects here,
    // where only op 1 is applied yet.
    let mut db = Db::new();
    db.commit(vec![item("1", "cold", "a")]);
    let positions = [BucketPosition {
        name: "1#global[]".into(),
        after: 3,
    }];
    let mut s = db.session(&positions, Budgets::default());
    assert!(
        json_lines(&db, &mut s, None).is_empty(),
        "no checkpoint older than the client's position"
    );
    assert!(s.is_unannounced());
    db.commit(vec![item("2", "cold", "b")]);
    assert!(
        json_lines(&db, &mut s, None).is_empty(),
        "still behind at op 2"
    );
    // Caught up (op 4): the checkpoint comes, with only the op after the client's position.
    db.commit(vec![item("3", "cold", "c"), item("4", "cold", "d")]);
    let lines = json_lines(&db, &mut s, None);
    assert_eq!(lines[0]["checkpoint"]["last_op_id"], "4");
    let data: Vec<&Value> = lines.iter().filter(|l| kind(l) == "data").collect();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["data"]["after"], "3");
    assert_eq!(data[0]["data"]["data"].as_array().unwrap().len(), 1);
    assert_eq!(kind(lines.last().unwrap()), "checkpoint_complete");
}

#[test]
fn a_large_bucket_streams_in_bounded_lines() {
    let mut db = Db::new();
    let n = 2500;
    let changes: Vec<Change> = (0..n).map(|i| item(&i.to_string(), "cold", "v")).collect();
    db.commit(changes);
    // The op counts bound lines when the byte bounds do not.
    let by_count = Budgets {
        batch_bytes: usize::MAX,
        chunk_bytes: usize::MAX,
        ..Budgets::default()
    };
    let mut s = db.session(&[], by_count);
    let mut client = Client::default();
    let first = s.checkpoint(&db.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    let mut sizes = Vec::new();
    while let Some(line) = s.next_line(&db.store).unwrap() {
        if let SyncLine::Data(d) = &line {
            sizes.push((d.ops.len(), d.has_more));
        }
        client.apply(&line.to_bytes(Encoding::Ndjson), None);
    }
    assert_eq!(sizes, [(1000, true), (1000, true), (500, false)]);
    assert_eq!(client.completions, 1);
    // By default a line closes at 16 KiB of rows and a batch at 64 KiB (what a stream
    // holds toward a slow client): every line stays near 16 KiB, all rows arrive.
    let mut s = db.session(&[], Budgets::default());
    let mut client = Client::default();
    let first = s.checkpoint(&db.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    let mut rows = 0;
    while let Some(line) = s.next_line(&db.store).unwrap() {
        if let SyncLine::Data(d) = &line {
            let bytes: usize = d.ops.iter().map(store::OpRead::data_len).sum();
            assert!(bytes < (16 << 10) + 100, "a line of {bytes} bytes of rows");
            rows += d.ops.len();
        }
        client.apply(&line.to_bytes(Encoding::Ndjson), None);
    }
    assert_eq!(rows, n);
    assert_eq!(client.completions, 1);
    // A byte budget closes chunks early.
    let mut s = db.session(
        &[],
        Budgets {
            chunk_bytes: 10_000,
            ..Budgets::default()
        },
    );
    s.checkpoint(&db.store, None).unwrap();
    let first = s.next_line(&db.store).unwrap().unwrap();
    let SyncLine::Data(d) = first else {
        panic!("data expected")
    };
    assert!(d.ops.len() < 1000 && d.has_more);
}

/// Two stores of one history (the same `commits` give the same op ids); then B writes
/// something of its own (a re-copy's merge, say: item 1 deleted), and its op ids fork away.
fn forked_pair(commits: &[Vec<Change>]) -> (Db, Db) {
    let (mut a, mut b) = (Db::new(), Db::new());
    for db in [&mut a, &mut b] {
        for changes in commits {
            db.commit(changes.clone());
        }
    }
    b.lsn += 1;
    b.store
        .write(b.lsn, |w| {
            w.diverge();
            w.delete_row(3, b"1")?;
            Ok(())
        })
        .unwrap();
    b.rows.remove(&("items", "1".to_owned()));
    (a, b)
}

#[test]
fn a_client_of_a_history_that_forked_away_is_cleared_and_downloads_again() {
    let (mut a, b) = forked_pair(&[
        vec![item("1", "cold", "a"), item("2", "hot", "b")],
        vec![item("3", "cold", "c")],
    ]);
    let forks = b.store.read(|v| v.forks()).unwrap();
    assert_eq!(forks.list().len(), 1, "one fork: {forks:?}");
    assert!(forks.list()[0].resumed_at >= store::forks::MIN_JUMP);
    // A writes on with ids B never gave out; a client follows A to its end.
    a.commit(vec![item("4", "hot", "d"), item("2", "cold", "b2")]);
    let mut client = Client::default();
    let mut s = a.session(&[], Budgets::default());
    step(&a, &mut s, &mut client, usize::MAX, Some(&a.truth()));
    assert_eq!(client.completions, 1);
    let positions = client.positions();
    assert!(
        positions.iter().all(|p| p.after > 3 && p.after < 10),
        "positions past the fork point, in B's gap: {positions:?}"
    );

    // The client moves to B: its positions lie in B's gap. Every bucket it held comes
    // again behind a CLEAR, and the checkpoint validates with exactly B's rows.
    client.reconnect();
    let mut s = b.session(&positions, Budgets::default());
    let lines = json_lines(&b, &mut s, None);
    let data: Vec<&Value> = lines.iter().filter(|l| kind(l) == "data").collect();
    assert!(!data.is_empty());
    for held in positions.iter().filter(|p| p.after > 0) {
        let first = data
            .iter()
            .find(|l| l["data"]["bucket"] == held.name.as_str())
            .unwrap_or_else(|| panic!("{} is sent again: {lines:?}", held.name));
        assert_eq!(first["data"]["after"], "0");
        assert_eq!(first["data"]["data"][0]["op"], "CLEAR", "{first}");
    }
    let mut s = b.session(&positions, Budgets::default());
    let kinds = step(&b, &mut s, &mut client, usize::MAX, Some(&b.truth()));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert_eq!(client.completions, 2);

    // A client that synced before the fork (from a third store of the history) keeps
    // its positions on B.
    let mut early = Client::default();
    let mut c = Db::new();
    c.commit(vec![item("1", "cold", "a"), item("2", "hot", "b")]);
    c.commit(vec![item("3", "cold", "c")]);
    let mut s = c.session(&[], Budgets::default());
    step(&c, &mut s, &mut early, usize::MAX, None);
    early.reconnect();
    let mut s = b.session(&early.positions(), Budgets::default());
    let lines = json_lines(&b, &mut s, None);
    assert!(
        !lines.iter().any(|l| l["data"]["data"][0]["op"] == "CLEAR"),
        "positions of the shared history are kept: {lines:?}"
    );
    let mut s = b.session(&early.positions(), Budgets::default());
    step(&b, &mut s, &mut early, usize::MAX, Some(&b.truth()));
    assert_eq!(early.completions, 2);
}

#[test]
fn a_reset_survives_a_checkpoint_that_supersedes_the_first_before_its_data() {
    let (mut a, mut b) = forked_pair(&[vec![item("1", "cold", "a"), item("2", "hot", "b")]]);
    a.commit(vec![item("3", "hot", "c")]);
    let mut client = Client::default();
    let mut s = a.session(&[], Budgets::default());
    step(&a, &mut s, &mut client, usize::MAX, None);
    client.reconnect();
    // On B the first checkpoint is announced, then superseded before any data is read.
    let mut s = b.session(&client.positions(), Budgets::default());
    let first = s.checkpoint(&b.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    b.commit(vec![item("4", "cold", "d")]);
    let truth = b.truth();
    let kinds = step(&b, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds.first().map(String::as_str), Some("checkpoint_diff"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert_eq!(client.completions, 2, "the client validates B's checkpoint");
}
