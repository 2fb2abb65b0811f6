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
    // Either way of publishing partitioned tables suits a table that is not one.
    primary.sql("ALTER PUBLICATION powersync SET (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)");
    assert!(validate(&primary, "postgres", &lists).await.is_ok());
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

/// A partitioned table is read as one table when the publication publishes its
/// partitions' changes under its name (`publish_via_partition_root = true`), and refused
/// with that fix otherwise (`PSM_R1018`); a partition is then refused with its partitioned
/// table's name (`PSM_R1019`), and read as a table of its own otherwise. Every partition
/// must send old rows that name the stored rows (`PSM_R1011`), and none be a foreign table
/// (`PSM_R1012`).
#[tokio::test]
async fn a_partitioned_table_is_read_through_its_own_name_only() {
    let install = PgInstall::primary();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(
        "CREATE TABLE todos (id text, list text, title text, PRIMARY KEY (id, list))
           PARTITION BY LIST (list);
         CREATE TABLE todos_a PARTITION OF todos FOR VALUES IN ('a');
         CREATE TABLE todos_b PARTITION OF todos FOR VALUES IN ('b') PARTITION BY HASH (id);
         CREATE TABLE todos_b0 PARTITION OF todos_b FOR VALUES WITH (MODULUS 2, REMAINDER 0);
         CREATE TABLE todos_b1 PARTITION OF todos_b FOR VALUES WITH (MODULUS 2, REMAINDER 1);
         CREATE PUBLICATION powersync FOR ALL TABLES;",
    );
    let todos = [table("todos")];
    let err = code(validate(&primary, "postgres", &todos).await);
    assert!(
        err.starts_with("PSM_R1018")
            && err.contains("SET (publish_via_partition_root = true)")
            && err.contains("public.todos"),
        "{err}"
    );
    let leaf = [table("todos_a")];
    assert!(validate(&primary, "postgres", &leaf).await.is_ok());

    primary.sql("ALTER PUBLICATION powersync SET (publish_via_partition_root = true)");
    let got = validate(&primary, "postgres", &todos).await.unwrap();
    assert_eq!(
        got,
        vec![(
            "todos".into(),
            ReplicaIdentity::Default,
            vec!["id".into(), "list".into()]
        )]
    );
    for partition in ["todos_a", "todos_b1"] {
        let err = code(validate(&primary, "postgres", &[table(partition)]).await);
        assert!(
            err.starts_with("PSM_R1019") && err.contains("read public.todos in the sync rules"),
            "{err}"
        );
    }

    // A partition whose old rows carry every column still names the stored row; one
    // keyed by other columns does not.
    primary.sql(
        "CREATE TABLE todos_c PARTITION OF todos FOR VALUES IN ('c');
         ALTER TABLE todos_c REPLICA IDENTITY FULL;",
    );
    assert!(validate(&primary, "postgres", &todos).await.is_ok());
    primary.sql(
        "CREATE TABLE todos_d PARTITION OF todos FOR VALUES IN ('d');
         ALTER TABLE todos_d ALTER COLUMN title SET NOT NULL;
         CREATE UNIQUE INDEX todos_d_title ON todos_d (title);
         ALTER TABLE todos_d REPLICA IDENTITY USING INDEX todos_d_title;",
    );
    let err = code(validate(&primary, "postgres", &todos).await);
    assert!(
        err.starts_with("PSM_R1011")
            && err.contains("partition todos_d of public.todos")
            && err.contains("ALTER TABLE todos_d REPLICA IDENTITY FULL"),
        "{err}"
    );
    primary.sql("ALTER TABLE todos_d REPLICA IDENTITY DEFAULT");
    assert!(validate(&primary, "postgres", &todos).await.is_ok());

    // A foreign partition's changes are never published.
    primary.sql(
        "CREATE TABLE events (id text, kind text) PARTITION BY LIST (kind);
         ALTER TABLE events REPLICA IDENTITY FULL;
         CREATE TABLE events_local PARTITION OF events FOR VALUES IN ('local');
         ALTER TABLE events_local REPLICA IDENTITY FULL;
         CREATE FOREIGN DATA WRAPPER nowhere;
         CREATE SERVER elsewhere FOREIGN DATA WRAPPER nowhere;
         CREATE FOREIGN TABLE events_remote PARTITION OF events FOR VALUES IN ('remote')
           SERVER elsewhere;",
    );
    let err = code(validate(&primary, "postgres", &[table("events")]).await);
    assert!(
        err.starts_with("PSM_R1012") && err.contains("events_remote"),
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
