//! `event_definitions`: which payload queries the official compiler takes and which it
//! refuses (they have no effect in either: nothing consumes the events).

use super::Case;

fn with_events(name: &str, events: &str) -> Case {
    Case::new(
        name,
        format!(
            "bucket_definitions:\n  b:\n    data:\n      - SELECT * FROM lists\nevent_definitions:\n{events}"
        ),
    )
    .row(
        "lists",
        &[("id", "text", Some("l1")), ("owner_id", "text", Some("u1"))],
    )
}

/// Every event case.
pub fn all() -> Vec<Case> {
    let payload = |name: &str, query: &str| {
        with_events(
            name,
            &format!("  write_checkpoints:\n    payloads:\n      - {query}\n"),
        )
    };
    vec![
        payload(
            "events/documented-write-checkpoints",
            "select user_id, client_id, checkpoint from checkpoints",
        ),
        payload("events/star", "SELECT * FROM checkpoints"),
        payload("events/where", "SELECT user_id FROM checkpoints WHERE checkpoint > 1"),
        payload("events/expression", "SELECT upper(user_id) AS u, checkpoint + 1 AS next FROM checkpoints"),
        payload("events/wildcard-table", "SELECT user_id FROM \"checkpoints_%\""),
        payload("events/request-value", "SELECT request.user_id() AS u FROM checkpoints"),
        payload("events/two-tables", "SELECT a.user_id FROM checkpoints a, lists b"),
        payload("events/no-table", "SELECT 1 AS one"),
        with_events(
            "events/two-payloads-two-events",
            "  a:\n    payloads:\n      - SELECT user_id FROM checkpoints\n      - SELECT id FROM lists\n  b:\n    payloads:\n      - SELECT id FROM lists\n",
        ),
        with_events(
            "events/payloads-not-a-list",
            "  write_checkpoints:\n    payloads: SELECT user_id FROM checkpoints\n",
        ),
        Case::new(
            "events/beside-streams",
            "config:\n  edition: 3\nstreams:\n  s:\n    auto_subscribe: true\n    query: SELECT * FROM lists\nevent_definitions:\n  e:\n    payloads:\n      - SELECT user_id, checkpoint FROM checkpoints\n",
        ),
    ]
}
