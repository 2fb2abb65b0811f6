//! Line shapes against the official service's captured output, and BSON decoded back.

use serde_json::Value;

use super::*;
use store::ObjectRead;

const VECTORS: &str =
    include_str!("../../../../e2e/fixture/vectors/tasks-streams-routed-1m.ndjson");

fn put(op_id: u64, checksum: u32) -> OpRead {
    OpRead {
        op_id,
        kind: OpKind::Put,
        checksum,
        object: Some(ObjectRead {
            object_type: "tasks".into(),
            object_id: "t1".into(),
            subkey: "1/7".into(),
            data: Some("{\"id\":\"t1\",\"n\":\"a\\\"b\"}".into()),
        }),
    }
}

fn remove(op_id: u64) -> OpRead {
    OpRead {
        op_id,
        kind: OpKind::Remove,
        checksum: 2_521_132_798,
        object: Some(ObjectRead {
            object_type: "tasks".into(),
            object_id: "t0".into(),
            subkey: "1/6".into(),
            data: None,
        }),
    }
}

fn samples() -> Vec<SyncLine> {
    let bucket = |checksum| BucketChecksum {
        bucket: "1#tasks_by_auth_project|0[\"p1\"]".into(),
        checksum,
        count: 1003,
        priority: 3,
        subscriptions: vec![BucketReason::Subscription(0)],
    };
    vec![
        SyncLine::Checkpoint(CheckpointLine {
            last_op_id: 2_001_005,
            write_checkpoint: None,
            buckets: vec![bucket(1_391_997_441)],
            streams: vec![StreamDescription {
                name: "tasks_by_auth_project".into(),
                is_default: false,
                errors: vec![],
            }],
        }),
        SyncLine::Data(DataLine {
            bucket: "1#tasks_by_auth_project|0[\"p1\"]".into(),
            after: 0,
            next_after: 2000,
            has_more: true,
            ops: vec![put(2, 2_268_963_827), remove(2000)],
        }),
        SyncLine::CheckpointComplete {
            last_op_id: 2_001_005,
        },
        SyncLine::CheckpointDiff(CheckpointDiffLine {
            last_op_id: 2_001_009,
            write_checkpoint: None,
            updated_buckets: vec![bucket(4_034_427_321)],
            removed_buckets: vec!["1#tasks_by_auth_project|0[\"p2\"]".into()],
        }),
        SyncLine::TokenExpiresIn(85197),
    ]
}

/// The JSON kind of each leaf, keyed by path with array indices collapsed.
fn shape(v: &Value, path: &str, out: &mut std::collections::BTreeMap<String, String>) {
    match v {
        Value::Object(o) => {
            for (k, v) in o {
                shape(v, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(a) => {
            for v in a {
                shape(v, &format!("{path}[]"), out);
            }
        }
        Value::String(_) => {
            out.insert(path.into(), "string".into());
        }
        Value::Number(n) => {
            let kind = if n.as_i64().is_some_and(|i| i < 0) {
                "signed"
            } else {
                "number"
            };
            // Bucket checksums may be either sign; only the kind must agree.
            let kind = if path.ends_with("buckets[].checksum") {
                "number"
            } else {
                kind
            };
            out.insert(path.into(), kind.into());
        }
        Value::Bool(_) => {
            out.insert(path.into(), "bool".into());
        }
        Value::Null => {}
    }
}

#[test]
fn ndjson_lines_have_the_service_shapes() {
    use std::collections::BTreeMap;
    let mut official: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in VECTORS.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let key = v.as_object().unwrap().keys().next().unwrap().clone();
        shape(&v, "", official.entry(key).or_default());
    }
    let mut ours: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for line in samples() {
        let bytes = line.to_bytes(Encoding::Ndjson);
        assert_eq!(bytes.last(), Some(&b'\n'));
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 1, "exactly one top-level key");
        let key = v.as_object().unwrap().keys().next().unwrap().clone();
        shape(&v, "", ours.entry(key).or_default());
    }
    assert_eq!(
        official.keys().collect::<Vec<_>>(),
        ours.keys().collect::<Vec<_>>()
    );
    for (kind, fields) in &official {
        for (path, value_kind) in fields {
            assert_eq!(
                ours[kind].get(path),
                Some(value_kind),
                "{kind}: field {path} should be {value_kind}"
            );
        }
    }
}

#[test]
fn ndjson_values_follow_the_wire_rules() {
    sample_lines_follow_the_wire_rules();
    ops_without_objects_and_write_checkpoints_follow_the_wire_rules();
    stream_errors_follow_the_wire_rules();
}

/// The samples' op ids are strings, op checksums unsigned, bucket checksums signed.
fn sample_lines_follow_the_wire_rules() {
    let lines: Vec<Value> = samples()
        .iter()
        .map(|l| serde_json::from_slice(&l.to_bytes(Encoding::Ndjson)).unwrap())
        .collect();
    let cp = &lines[0]["checkpoint"];
    assert_eq!(cp["last_op_id"], "2001005");
    assert!(cp.get("write_checkpoint").is_none());
    assert_eq!(cp["buckets"][0]["checksum"], 1_391_997_441);
    assert_eq!(
        cp["buckets"][0]["subscriptions"],
        serde_json::json!([{"sub": 0}])
    );
    let data = &lines[1]["data"];
    assert_eq!(
        (&data["after"], &data["next_after"]),
        (&"0".into(), &"2000".into())
    );
    let put = &data["data"][0];
    assert_eq!(
        put["checksum"], 2_268_963_827u64,
        "op checksums are unsigned"
    );
    assert_eq!(put["data"], "{\"id\":\"t1\",\"n\":\"a\\\"b\"}");
    let rm = &data["data"][1];
    assert_eq!(rm["op"], "REMOVE");
    assert_eq!(rm["subkey"], "1/6");
    assert!(rm.get("data").is_none());
    let diff = &lines[3]["checkpoint_diff"];
    assert_eq!(
        diff["updated_buckets"][0]["checksum"], -260_539_975,
        "bucket checksums are signed"
    );
    assert_eq!(
        diff["removed_buckets"][0],
        "1#tasks_by_auth_project|0[\"p2\"]"
    );
}

/// MOVE and CLEAR carry no object fields; a partial completion its priority; a diff its
/// write checkpoint as a string.
fn ops_without_objects_and_write_checkpoints_follow_the_wire_rules() {
    let moved = SyncLine::Data(DataLine {
        bucket: "b".into(),
        after: 1,
        next_after: 3,
        has_more: false,
        ops: vec![
            OpRead {
                op_id: 2,
                kind: OpKind::Move,
                checksum: 5,
                object: None,
            },
            OpRead {
                op_id: 3,
                kind: OpKind::Clear,
                checksum: u32::MAX,
                object: None,
            },
        ],
    });
    let v: Value = serde_json::from_slice(&moved.to_bytes(Encoding::Ndjson)).unwrap();
    assert_eq!(
        v["data"]["data"],
        serde_json::json!([{"op_id":"2","op":"MOVE","checksum":5},{"op_id":"3","op":"CLEAR","checksum":4294967295u64}])
    );
    let partial = SyncLine::PartialCheckpointComplete {
        last_op_id: 9,
        priority: 1,
    };
    assert_eq!(
        partial.to_bytes(Encoding::Ndjson),
        b"{\"partial_checkpoint_complete\":{\"last_op_id\":\"9\",\"priority\":1}}\n"
    );
    let with_wc = SyncLine::CheckpointDiff(CheckpointDiffLine {
        last_op_id: 2,
        write_checkpoint: Some(7),
        updated_buckets: vec![],
        removed_buckets: vec![],
    });
    assert_eq!(
        with_wc.to_bytes(Encoding::Ndjson),
        b"{\"checkpoint_diff\":{\"last_op_id\":\"2\",\"write_checkpoint\":\"7\",\"updated_buckets\":[],\"removed_buckets\":[]}}\n"
    );
}

/// A stream's errors name their subscription: `default`, or its index (an int32 in BSON).
fn stream_errors_follow_the_wire_rules() {
    let errors = SyncLine::Checkpoint(CheckpointLine {
        last_op_id: 0,
        write_checkpoint: None,
        buckets: vec![],
        streams: vec![StreamDescription {
            name: "s".into(),
            is_default: true,
            errors: vec![
                StreamError {
                    subscription: None,
                    message: "m".into(),
                },
                StreamError {
                    subscription: Some(2),
                    message: "n".into(),
                },
            ],
        }],
    });
    let v: Value = serde_json::from_slice(&errors.to_bytes(Encoding::Ndjson)).unwrap();
    assert_eq!(
        v["checkpoint"]["streams"][0]["errors"],
        serde_json::json!([{"subscription":"default","message":"m"},{"subscription":2,"message":"n"}])
    );
    // In BSON the index is an int32, as the official service's numbers are: the official
    // client takes a subscription index as int32 (BSON) or unsigned (JSON), not int64,
    // and fails the whole line otherwise.
    let doc =
        bson::Document::from_reader(&mut std::io::Cursor::new(errors.to_bytes(Encoding::Bson)))
            .unwrap();
    let error = doc
        .get_document("checkpoint")
        .unwrap()
        .get_array("streams")
        .unwrap()[0]
        .as_document()
        .unwrap()
        .get_array("errors")
        .unwrap()[1]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(error.get("subscription"), Some(&bson::Bson::Int32(2)));
}

#[test]
fn bson_documents_decode_to_the_same_lines() {
    let mut stream = Vec::new();
    for line in samples() {
        line.encode(Encoding::Bson, &mut stream);
    }
    let mut reader = std::io::Cursor::new(&stream);
    let mut docs = Vec::new();
    while (reader.position() as usize) < stream.len() {
        docs.push(bson::Document::from_reader(&mut reader).unwrap());
    }
    assert_eq!(docs.len(), samples().len(), "documents back to back");
    for (doc, line) in docs.iter().zip(samples()) {
        assert_eq!(doc.len(), 1);
        let json: Value = serde_json::from_slice(&line.to_bytes(Encoding::Ndjson)).unwrap();
        // Relaxed extended JSON of the BSON equals the NDJSON line (int64 as numbers).
        let relaxed = bson::Bson::Document(doc.clone()).into_relaxed_extjson();
        assert_eq!(relaxed, json);
    }
    let data = docs[1].get_document("data").unwrap();
    assert_eq!(data.get_str("next_after").unwrap(), "2000");
    let ops = data.get_array("data").unwrap();
    let op = ops[0].as_document().unwrap();
    assert_eq!(op.get_i64("checksum").unwrap(), 2_268_963_827);
    assert_eq!(op.get_str("op_id").unwrap(), "2");
    assert!(op.get_str("data").is_ok(), "data stays a string");
    let cp = docs[0].get_document("checkpoint").unwrap();
    let b = cp.get_array("buckets").unwrap()[0].as_document().unwrap();
    assert_eq!(b.get_i64("checksum").unwrap(), 1_391_997_441);
    assert_eq!(b.get_i32("priority").unwrap(), 3);
    assert_eq!(docs[4].get_i32("token_expires_in").unwrap(), 85197);
}

#[test]
fn content_types_are_exact() {
    assert_eq!(Encoding::Ndjson.content_type(), "application/x-ndjson");
    assert_eq!(
        Encoding::Bson.content_type(),
        "application/vnd.powersync.bson-stream"
    );
}

/// Clients that did not ask for `raw_data: true` get each PUT's row as an object, as the
/// official service sends them; every other field, and the other lines, stay the same.
#[test]
fn without_raw_data_rows_are_objects() {
    for line in samples() {
        let raw: Value = serde_json::from_slice(&line.to_bytes(Encoding::Ndjson)).unwrap();
        let nested: Value =
            serde_json::from_slice(&line.to_bytes(Encoding::NdjsonNestedData)).unwrap();
        let Some(ops) = raw["data"]["data"].as_array() else {
            assert_eq!(nested, raw);
            continue;
        };
        for (index, op) in ops.iter().enumerate() {
            let got = &nested["data"]["data"][index];
            match op["data"].as_str() {
                Some(text) => {
                    assert_eq!(got["data"], serde_json::from_str::<Value>(text).unwrap());
                    let mut rest = got.clone();
                    rest["data"] = op["data"].clone();
                    assert_eq!(&rest, op);
                }
                None => assert_eq!(got, op),
            }
        }
    }
    assert_eq!(
        Encoding::NdjsonNestedData.content_type(),
        "application/x-ndjson"
    );
}
