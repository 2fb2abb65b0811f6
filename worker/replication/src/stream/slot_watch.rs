//! Watching the slot over an ordinary connection while the stream runs: how much WAL the
//! primary retains for it (for `status()`) and the primary's WAL position (for the lag
//! in bytes).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use crate::liveness::asked;
use crate::plan::SourcePlan;
use crate::progress::StreamProgress;
use source::connect;

/// How often the slot is read.
pub(super) const EVERY: Duration = Duration::from_secs(10);

/// Every `every`, how much WAL the primary retains for the slot and its current WAL
/// position, into `progress`; errors only skip a reading (the stream reports real
/// failures).
pub(super) async fn watch_slot(plan: SourcePlan, progress: Arc<StreamProgress>, every: Duration) {
    let mut client = None;
    loop {
        if client.is_none() {
            client = connect(&plan.connection).await.ok();
        }
        if let Some(c) = &client {
            // An answer the network stopped forwarding is given up; the next turn connects
            // again.
            let row = asked(c.query_opt(
                "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint, \
                 (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&plan.slot],
            ))
            .await;
            match row {
                Some(Ok(Some(row))) => {
                    if let Ok(Some(bytes)) = row.try_get::<_, Option<i64>>(0) {
                        progress
                            .retained_wal_bytes
                            .store(u64::try_from(bytes).unwrap_or(0), Relaxed);
                    }
                    if let Ok(Some(head)) = row.try_get::<_, Option<i64>>(1) {
                        progress
                            .primary_head_lsn
                            .store(u64::try_from(head).unwrap_or(0), Relaxed);
                    }
                }
                Some(Ok(None)) => {}
                Some(Err(_)) | None => client = None,
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::{Cluster, ClusterKind, PgInstall, TcpProxy, TestDir};

    /// The network to the primary stops forwarding while the slot is read (nothing
    /// closes): the reading is given up in time and the next one made over a new
    /// connection, instead of the numbers in `status()` staying where they were.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reading_the_network_stops_answering_is_made_again() {
        let install = PgInstall::pg16();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
        primary.sql("SELECT pg_create_logical_replication_slot('watched', 'pgoutput')");
        let proxy = TcpProxy::start(primary.port());
        let plan = SourcePlan {
            connection: config::SourceConnection::from_uri(&proxy.uri()).unwrap(),
            slot: "watched".into(),
        };
        let progress = Arc::new(StreamProgress::default());
        let head = || progress.primary_head_lsn.load(Relaxed);
        let task = tokio::spawn(watch_slot(
            plan,
            progress.clone(),
            Duration::from_millis(100),
        ));
        testkit::wait_until("the first reading", || (head() > 0).then_some(()));

        proxy.stall_when_client_sends(Some("pg_current_wal_lsn() - restart_lsn"));
        testkit::wait_until("a reading to be sent", || {
            (proxy.stalled_on_sending() > 0).then_some(())
        });
        proxy.stall_when_client_sends(None);
        primary.sql("CREATE TABLE moved AS SELECT generate_series(1, 1000) AS n");
        let moved = testkit::buckets::lsn(&primary.sql("SELECT pg_current_wal_lsn()"));
        testkit::wait_until("a reading past the new WAL", || {
            (head() >= moved).then_some(())
        });
        task.abort();
    }
}
