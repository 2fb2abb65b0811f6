//! Warnings: where each one points (rule, query, line and column, the text), its code and
//! its text, and what silences it. Which rules warn is the oracle's subject
//! (`oracle/warnings.rs`, against the official compiler).
use rules::{RulesWarning, SyncRules, WarningKind};

fn warnings(yaml: &str) -> Vec<RulesWarning> {
    SyncRules::parse(yaml).unwrap().warnings().to_vec()
}

#[test]
fn a_client_parameter_query_is_warned_about_as_a_whole_unless_accepted() {
    let yaml = "bucket_definitions:\n  b:\n    parameters: SELECT request.parameters() ->> 'p' AS p\n    data:\n      - SELECT * FROM todos WHERE list = bucket.p\n";
    let w = warnings(yaml);
    assert_eq!(w.len(), 1, "{w:?}");
    let w = &w[0];
    assert_eq!(w.kind, WarningKind::ClientParameterQuery);
    assert_eq!(w.kind.code(), "PSM_RULES_WARN_CLIENT_PARAMETERS");
    assert_eq!(
        (
            w.location.kind,
            w.location.rule.as_str(),
            w.location.query_label.as_str()
        ),
        ("bucket definition", "b", "parameters[0]")
    );
    assert_eq!((w.location.line, w.location.column), (1, 1));
    assert_eq!(w.excerpt, "SELECT request.parameters() ->> 'p' AS p");
    let text = w.to_string();
    assert!(
        text.starts_with("[PSM_RULES_WARN_CLIENT_PARAMETERS] bucket definition `b`, parameters[0] `SELECT request.parameters() ->> 'p' AS p` at line 1, column 1: "),
        "{text}"
    );
    assert!(
        text.contains("Potentially dangerous query based on parameters set by the client"),
        "{text}"
    );
    assert!(text.contains("Fix: also match a token value"), "{text}");

    let accepted = yaml.replace(
        "  b:\n",
        "  b:\n    accept_potentially_dangerous_queries: true\n",
    );
    assert_eq!(warnings(&accepted), vec![]);
    // Warnings change nothing compiled: the same buckets either way.
    let (a, b) = (
        SyncRules::parse(yaml).unwrap(),
        SyncRules::parse(&accepted).unwrap(),
    );
    assert_eq!(a.sources()[0].parameters, b.sources()[0].parameters);
}

#[test]
fn identifiers_are_located_by_line_and_column_in_the_query() {
    let yaml = "bucket_definitions:\n  b:\n    data:\n      - |\n        SELECT id\n          FROM todos WHERE Done\n";
    let w = warnings(yaml);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].kind, WarningKind::IdentifierCase);
    assert_eq!((w[0].location.line, w[0].location.column), (2, 20));
    assert_eq!(w[0].excerpt, "Done");
    assert_eq!(w[0].location.query_label, "data[0]");
    assert!(
        w[0].to_string()
            .contains("at line 2, column 20 (`Done`): the unquoted identifier `Done` means `done`"),
        "{}",
        w[0]
    );
    // Quoted, or at edition 3, nothing.
    assert_eq!(warnings(&yaml.replace("Done", "\"Done\"")), vec![]);
}

#[test]
fn an_unauthenticated_value_is_located_where_it_is_written_even_in_a_cte() {
    let yaml = "config:\n  edition: 3\nstreams:\n  s:\n    with:\n      mine: SELECT id FROM projects WHERE org = connection.parameter('org')\n    query: SELECT todos.* FROM todos, mine WHERE todos.list = mine.id\n";
    let w = warnings(yaml);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].kind, WarningKind::UnauthenticatedParameter);
    assert_eq!(
        (
            w[0].location.rule.as_str(),
            w[0].location.query_label.as_str()
        ),
        ("s", "with.mine")
    );
    assert_eq!((w[0].location.line, w[0].location.column), (1, 37));
    assert_eq!(w[0].excerpt, "connection.parameter('org')");
    let accepted = yaml.replace(
        "  s:\n",
        "  s:\n    accept_potentially_dangerous_queries: true\n",
    );
    assert_eq!(warnings(&accepted), vec![]);
    // A token value anywhere in the bucket's parameters is enough.
    let with_token = yaml.replace("WHERE org = ", "WHERE owner = auth.user_id() AND org = ");
    assert_eq!(warnings(&with_token), vec![]);
}

#[test]
fn warnings_about_the_file_name_the_key_or_cte() {
    let yaml = "config:\n  edition: 3\n  storage_version: 3\nwith:\n  spare: SELECT id FROM projects\nstreams:\n  s:\n    with:\n      extra: SELECT id FROM projects\n    query: SELECT * FROM todos\n";
    let texts: Vec<String> = warnings(yaml).iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert!(
        texts[0].starts_with("[PSM_RULES_WARN_STORAGE_VERSION] key `config.storage_version`: "),
        "{texts:?}"
    );
    assert!(
        texts[1]
            .starts_with("[PSM_RULES_WARN_UNUSED_CTE] CTE `spare`: no query reads the CTE `spare`"),
        "{texts:?}"
    );
    assert!(
        texts[2].starts_with(
            "[PSM_RULES_WARN_UNUSED_CTE] stream `s`, with.extra: no query reads the CTE `extra`"
        ),
        "{texts:?}"
    );

    let alpha = warnings("config:\n  edition: 2\nstreams:\n  s:\n    query: SELECT * FROM todos\n");
    assert_eq!(alpha.len(), 1);
    assert_eq!(alpha[0].kind, WarningKind::AlphaStreams);
    assert!(
        alpha[0]
            .to_string()
            .contains("Fix: `config: { edition: 3 }`"),
        "{}",
        alpha[0]
    );
}

#[test]
fn edition_3_columns_and_stars() {
    let yaml = "config:\n  edition: 3\nstreams:\n  s:\n    query: SELECT list AS l, *, length(id) FROM todos\n";
    let w = warnings(yaml);
    let found: Vec<(WarningKind, &str, u64)> = w
        .iter()
        .map(|w| (w.kind, w.excerpt.as_str(), w.location.column))
        .collect();
    assert_eq!(
        found,
        vec![
            (WarningKind::UnnamedColumn, "length(id)", 22),
            (WarningKind::StarAfterAlias, "*", 19),
        ]
    );
}

#[test]
fn a_default_alpha_stream_reading_subscription_parameters() {
    let yaml = "config:\n  edition: 2\nstreams:\n  s:\n    auto_subscribe: true\n    query: SELECT * FROM todos WHERE list = subscription.parameter('list')\n";
    let kinds: Vec<WarningKind> = warnings(yaml).iter().map(|w| w.kind).collect();
    assert_eq!(
        kinds,
        vec![
            WarningKind::AlphaStreams,
            WarningKind::DefaultSubscriptionParameters
        ]
    );
    let not_default = yaml.replace("    auto_subscribe: true\n", "");
    let kinds: Vec<WarningKind> = warnings(&not_default).iter().map(|w| w.kind).collect();
    assert_eq!(kinds, vec![WarningKind::AlphaStreams]);
}
