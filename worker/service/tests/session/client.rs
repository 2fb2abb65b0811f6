//! The model of the client (powersync-sqlite-core): it applies each NDJSON line, checks
//! what the protocol promises of it, and validates each completed checkpoint.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;
use service::BucketPosition;

/// Bucket → (object_type, object_id) → data.
pub(super) type Truth = BTreeMap<String, BTreeMap<(String, String), String>>;

/// One bucket as the client holds it.
#[derive(Debug, Clone, Default)]
pub(super) struct ClientBucket {
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
pub(super) struct Client {
    pub(super) buckets: BTreeMap<String, ClientBucket>,
    target: Option<Target>,
    /// A line was seen on this connection.
    connected: bool,
    pub(super) completions: usize,
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
    pub(super) fn positions(&self) -> Vec<BucketPosition> {
        self.buckets
            .iter()
            .map(|(name, b)| BucketPosition {
                name: name.clone(),
                after: b.last_op,
            })
            .collect()
    }

    /// A new connection: the server's first line must be a full checkpoint.
    pub(super) fn reconnect(&mut self) {
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
    pub(super) fn apply(&mut self, bytes: &[u8], truth: Option<&Truth>) -> String {
        assert_eq!(bytes.last(), Some(&b'\n'));
        let v: Value = serde_json::from_slice(bytes).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 1, "one top-level key");
        let (kind, body) = obj.iter().next().unwrap();
        match kind.as_str() {
            "checkpoint" => self.apply_checkpoint(body),
            "checkpoint_diff" => self.apply_diff(body),
            "data" => self.apply_data(body),
            "checkpoint_complete" | "partial_checkpoint_complete" => {
                self.apply_completion(kind, body, truth)
            }
            other => panic!("unexpected line {other}"),
        }
        self.connected = true;
        kind.clone()
    }

    /// A full checkpoint: the client's new target; buckets not in it are dropped.
    fn apply_checkpoint(&mut self, body: &Value) {
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

    /// A checkpoint diff: the target's buckets removed and updated.
    fn apply_diff(&mut self, body: &Value) {
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

    /// A data line: its ops applied to the bucket, each within `after` and the checkpoint.
    fn apply_data(&mut self, body: &Value) {
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

    /// A (partial) completion: every bucket it covers validates against its checksum,
    /// and, for a full completion with `truth`, holds exactly the rows the rules give.
    fn apply_completion(&mut self, kind: &str, body: &Value, truth: Option<&Truth>) {
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
}
