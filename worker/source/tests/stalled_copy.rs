//! A copy whose network stops forwarding midway (a proxy in between swallows everything and
//! closes nothing) fails with `PSM_R3003` within its progress bound instead of waiting
//! for rows forever.
use std::time::{Duration, Instant};

use config::SourceConnection;
use source::{connect, copy_table, table_columns, SourceError, SourceTable};
use testkit::{Cluster, ClusterKind, PgInstall, TcpProxy, TestDir};

#[test]
fn a_copy_that_stops_receiving_fails_within_its_progress_bound() {
    let install = PgInstall::primary();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    // About 60 MB: more than the sockets and the driver hold between them.
    primary.sql(
        "CREATE TABLE big (id int PRIMARY KEY, body text);
         INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(1, 300000) g;",
    );
    let oid: u32 = primary
        .sql("SELECT 'big'::regclass::oid")
        .trim()
        .parse()
        .unwrap();
    let proxy = TcpProxy::start(primary.port());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let conn = SourceConnection::from_uri(&proxy.uri()).unwrap();
        let client = connect(&conn).await.unwrap();
        let columns = table_columns(&client, oid).await.unwrap();
        let table = SourceTable {
            schema: "public".into(),
            name: "big".into(),
        };
        let bound = Duration::from_secs(3);
        let mut rows = copy_table(&client, &table, &columns, false, bound)
            .await
            .unwrap();
        for _ in 0..1000 {
            rows.next().await.unwrap().unwrap();
        }
        proxy.stall_open_connections();
        let stalled_at = Instant::now();
        let mut after = 0u64;
        let error = loop {
            match tokio::time::timeout(Duration::from_secs(60), rows.next()).await {
                Ok(Some(Ok(_))) => after += 1,
                Ok(Some(Err(e))) => break e,
                Ok(None) => panic!("the copy ended ({after} rows after the stall)"),
                Err(_) => panic!("the copy still waited 60 s after the network stopped"),
            }
        };
        let took = stalled_at.elapsed();
        assert!(matches!(error, SourceError::Stalled { .. }), "{error}");
        assert!(error.to_string().starts_with("PSM_R3003"), "{error}");
        assert!(error.to_string().contains("big"), "{error}");
        assert!(!error.needs_operator());
        // What was under way when it stopped still arrives, then the bound runs.
        assert!(after < 299_000, "{after} rows arrived after the stall");
        assert!(took >= bound, "failed after {took:?}");
        assert!(
            took < bound + Duration::from_secs(5),
            "failed after {took:?}"
        );
    });
}
