//! pgoutput change handling: a sequence of pgoutput messages (each a 2-byte little-endian
//! length and the body) through `replication::fuzzing::pgoutput_session`: the wire read
//! (`source::Pgoutput`), the stream's decoder with its relation checks, and the applier's row
//! handling without a store (tuple → values, unchanged TOAST values, rule evaluation,
//! identity, kept values). Tables and rules are the benchmark fixture's `tasks` and
//! `user_project_access` with its sync streams.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use replication::IntentTable;
use rules::SyncRules;
use source::ColumnMeta;

static RULES: LazyLock<SyncRules> = LazyLock::new(|| {
    SyncRules::parse(powersync_mdbx_fuzz::FIXTURE_STREAMS).expect("the fixture's rules compile")
});

fn column(name: &str, type_oid: u32) -> ColumnMeta {
    ColumnMeta {
        name: name.to_owned(),
        type_oid,
        element_oid: None,
        typlen: match type_oid {
            23 => 4,
            1184 => 8,
            _ => -1,
        },
        attnum: 0,
    }
}

/// As the snapshot recorded them: OIDs 16384 and 16385, keyed by `id`.
static TABLES: LazyLock<Vec<IntentTable>> = LazyLock::new(|| {
    let (text, int4, ts) = (25, 23, 1184);
    vec![
        IntentTable {
            id: 1,
            schema: "public".into(),
            name: "tasks".into(),
            columns: [
                ("id", text),
                ("org_id", text),
                ("project_id", text),
                ("owner_id", text),
                ("title", text),
                ("status", text),
                ("priority", int4),
                ("assignee_id", text),
                ("story_points", int4),
                ("updated_at", ts),
                ("summary", text),
            ]
            .iter()
            .map(|&(name, oid)| column(name, oid))
            .collect(),
            identity: vec!["id".into()],
            oid: 16384,
            recopy: false,
            rekey_from: Vec::new(),
            gone: false,
            partitions: None,
        },
        IntentTable {
            id: 2,
            schema: "public".into(),
            name: "user_project_access".into(),
            columns: [
                ("id", text),
                ("user_id", text),
                ("org_id", text),
                ("project_id", text),
                ("role", text),
                ("updated_at", ts),
            ]
            .iter()
            .map(|&(name, oid)| column(name, oid))
            .collect(),
            identity: vec!["id".into()],
            oid: 16385,
            recopy: false,
            rekey_from: Vec::new(),
            gone: false,
            partitions: None,
        },
    ]
});

/// The length-prefixed message bodies of `data`; a short last one is cut at the end.
fn messages(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (len, rest) = data.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_le_bytes(*len)).min(rest.len());
        let (body, rest) = rest.split_at(len);
        data = rest;
        Some(body)
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = replication::fuzzing::pgoutput_session(&RULES, &TABLES, messages(data))
        .expect("the fixed tables stream");
});
