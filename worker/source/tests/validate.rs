//! Live tests: validation of a real primary, one failure per setting that breaks replication.
use config::SourceConnection;
use source::{connect, validate_primary, ReplicaIdentity, SourceError, SourceTable};
use testkit::{Cluster, ClusterKind, PgInstall, TestDir};

fn table(name: &str) -> SourceTable {
    SourceTable {
        schema: "public".into(),
        name: name.into(),
    }
}

type Identities = Vec<(String, ReplicaIdentity, Vec<String>)>;

async fn validate(
    cluster: &Cluster,
    user: &str,
    tables: &[SourceTable],
) -> Result<Identities, SourceError> {
    let conn = SourceConnection::from_uri(&cluster.uri(user)).unwrap();
    let client = connect(&conn).await?;
    let info = validate_primary(&client, tables).await?;
    assert!(info.server_version >= 140_000);
    assert!(
        info.system_identifier.len() > 10,
        "{}",
        info.system_identifier
    );
    Ok(info
        .tables
        .into_iter()
        .map(|t| (t.table.name, t.identity, t.identity_columns))
        .collect())
}

fn code(result: Result<impl std::fmt::Debug, SourceError>) -> String {
    let err = result.unwrap_err();
    assert!(err.needs_operator(), "{err}");
    err.to_string()
}

#[tokio::test]
async fn accepts_a_ready_primary_and_reports_identities() {
    let install = PgInstall::primary();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TABLE lists (id text PRIMARY KEY, name text);
         CREATE TABLE todos (a int NOT NULL, b int NOT NULL, body text, UNIQUE (b, a));
         ALTER TABLE todos REPLICA IDENTITY USING INDEX todos_b_a_key;
         CREATE TABLE notes (n int, body text);
         ALTER TABLE notes REPLICA IDENTITY FULL;
         CREATE PUBLICATION powersync FOR ALL TABLES;",
    );
    let got = validate(
        &primary,
        "postgres",
        &[table("lists"), table("todos"), table("notes")],
    )
    .await
    .unwrap();
    assert_eq!(
        got,
        vec![
            ("lists".into(), ReplicaIdentity::Default, vec!["id".into()]),
            (
                "todos".into(),
                ReplicaIdentity::Index,
                vec!["b".into(), "a".into()]
            ),
            (
                "notes".into(),
                ReplicaIdentity::Full,
                vec!["n".into(), "body".into()]
            ),
        ]
    );
}

#[tokio::test]
async fn each_broken_setting_has_its_own_error() {
    let install = PgInstall::primary();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TABLE lists (id text PRIMARY KEY, name text, secret text);
         CREATE TABLE nokey (id text, name text);
         CREATE TABLE nothing (id text PRIMARY KEY);
         ALTER TABLE nothing REPLICA IDENTITY NOTHING;
         CREATE VIEW v AS SELECT 1 AS id;
         CREATE ROLE plain LOGIN;",
    );
    let lists = [table("lists")];
    assert!(code(validate(&primary, "postgres", &lists).await).starts_with("PSM_R1004"));
    primary.sql(
        "CREATE PUBLICATION powersync FOR TABLE lists WITH (publish = 'insert, update, delete')",
    );
    let err = code(validate(&primary, "postgres", &lists).await);
    assert!(
        err.starts_with("PSM_R1005") && err.contains("truncate"),
        "{err}"
    );
    primary.sql("ALTER PUBLICATION powersync SET (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)");
    assert!(code(validate(&primary, "postgres", &lists).await).starts_with("PSM_R1006"));
    primary.sql("ALTER PUBLICATION powersync SET (publish_via_partition_root = false)");
    assert!(validate(&primary, "postgres", &lists).await.is_ok());

    let err = code(validate(&primary, "postgres", &[table("nokey")]).await);
    assert!(
        err.starts_with("PSM_R1008") && err.contains("ADD TABLE public.nokey"),
        "{err}"
    );
    primary.sql("ALTER PUBLICATION powersync ADD TABLE nokey, nothing");
    let err = code(validate(&primary, "postgres", &[table("nokey")]).await);
    assert!(
        err.starts_with("PSM_R1011") && err.contains("no primary key"),
        "{err}"
    );
    let err = code(validate(&primary, "postgres", &[table("nothing")]).await);
    assert!(
        err.starts_with("PSM_R1011") && err.contains("NOTHING"),
        "{err}"
    );
    assert!(
        code(validate(&primary, "postgres", &[table("absent")]).await).starts_with("PSM_R1007")
    );
    assert!(code(validate(&primary, "postgres", &[table("v")]).await).starts_with("PSM_R1012"));

    primary.sql("ALTER PUBLICATION powersync SET TABLE lists WHERE (name <> 'hidden')");
    assert!(code(validate(&primary, "postgres", &lists).await).starts_with("PSM_R1009"));
    primary.sql("ALTER PUBLICATION powersync SET TABLE lists (id, name)");
    assert!(code(validate(&primary, "postgres", &lists).await).starts_with("PSM_R1010"));
    primary.sql("ALTER PUBLICATION powersync SET TABLE lists");
    assert!(validate(&primary, "postgres", &lists).await.is_ok());

    assert!(code(validate(&primary, "plain", &lists).await).starts_with("PSM_R1003"));
}

#[tokio::test]
async fn wal_level_replica_and_unreachable_primaries() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let plain = Cluster::start_new(&install, &dir, "plain", ClusterKind::Plain, &[]);
    let err = code(validate(&plain, "postgres", &[]).await);
    assert!(
        err.starts_with("PSM_R1002") && err.contains("wal_level = logical"),
        "{err}"
    );

    let port = testkit::free_port();
    let conn = SourceConnection::from_uri(&format!(
        "postgresql://postgres@127.0.0.1:{port}/postgres?sslmode=disable"
    ))
    .unwrap();
    let err = connect(&conn).await.unwrap_err();
    assert!(
        !err.needs_operator(),
        "a refused connection is retried: {err}"
    );

    // verify-full against a server without TLS fails closed, never falls back to plain text.
    let conn = SourceConnection::from_uri(&format!(
        "postgresql://postgres@127.0.0.1:{}/postgres",
        plain.port()
    ))
    .unwrap();
    let err = connect(&conn).await.unwrap_err();
    assert!(
        err.to_string().starts_with("PSM_R2001") && err.needs_operator(),
        "{err}"
    );
}

/// PostgreSQL 13 (`scripts/install_primaries.sh` installs it) is refused before anything is
/// created on it, with the reason and the fix.
#[tokio::test]
async fn a_postgresql_13_primary_is_refused_with_the_reason() {
    let install = PgInstall::primary_of_major(13);
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    let err = code(validate(&primary, "postgres", &[]).await);
    assert!(
        err.starts_with("PSM_R1001")
            && err.contains("PostgreSQL 13.")
            && err.contains("14 or later"),
        "{err}"
    );
    let slots = primary.sql("SELECT count(*) FROM pg_replication_slots");
    assert_eq!(slots.trim(), "0", "nothing created on it");
}

/// A PostgreSQL 18 publication that publishes generated columns is refused, with the fix.
#[tokio::test]
async fn a_publication_of_generated_columns_is_refused_with_the_fix() {
    let install = PgInstall::primary_of_major(18);
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TABLE gen (id text PRIMARY KEY, n int, d int GENERATED ALWAYS AS (n * 2) STORED);
         CREATE PUBLICATION powersync FOR TABLE gen WITH (publish_generated_columns = stored);",
    );
    let err = code(validate(&primary, "postgres", &[table("gen")]).await);
    assert!(
        err.starts_with("PSM_R1015") && err.contains("publish_generated_columns = none"),
        "{err}"
    );
    primary.sql("ALTER PUBLICATION powersync SET (publish_generated_columns = none)");
    validate(&primary, "postgres", &[table("gen")])
        .await
        .unwrap();
}
