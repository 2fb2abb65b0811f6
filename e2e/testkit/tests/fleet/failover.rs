//! A client behind HAProxy moves between seeded replicas (a failover, a drain) without
//! downloading its buckets again.
use testkit::{free_port, Cluster, PgInstall, TestDir};

use super::{buckets, checksum_warnings, metric, FixtureSource};

/// Debian's HAProxy in front of the replicas: round robin, health checks on
/// `/probes/readiness`, a connection refused by one replica retried on another, and an
/// admin socket to drain a server. Stopped (by pid) when dropped.
struct Balancer {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl Balancer {
    fn start(dir: &TestDir, port: u16, replicas: &[u16]) -> Self {
        let haproxy = ["/usr/sbin/haproxy", "/usr/bin/haproxy"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!("haproxy is not installed: run scripts/setup.sh (apt package haproxy)")
            });
        let socket = dir.path().join("haproxy.sock");
        let servers: String = replicas
            .iter()
            .enumerate()
            .map(|(i, p)| format!("  server r{i} 127.0.0.1:{p} check\n"))
            .collect();
        let config = dir.write(
            "haproxy.cfg",
            &format!(
                "global\n  stats socket {} mode 600 level admin\n\
                 defaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  \
                 timeout server 120s\n  retries 3\n  option redispatch\n\
                 frontend sync\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
                 backend replicas\n  balance roundrobin\n  option httpchk GET /probes/readiness\n  \
                 http-check expect status 200\n  default-server inter 300ms fall 2 rise 1\n{servers}",
                socket.display()
            ),
        );
        let child = std::process::Command::new(haproxy)
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("haproxy starts");
        testkit::wait_until("HAProxy answering", || {
            testkit::http_get(port, "/probes/readiness")
                .filter(|r| r.status == 200)
                .map(|_| ())
        });
        Self { child, socket }
    }

    /// One command on the admin socket; its answer.
    fn admin(&self, command: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::os::unix::net::UnixStream::connect(&self.socket)
            .unwrap_or_else(|e| panic!("HAProxy's admin socket {}: {e}", self.socket.display()));
        stream.write_all(format!("{command}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    /// Drains server `index` as an operator does before taking a replica down: no new
    /// connections go to it, then the ones it holds are closed (their clients reconnect
    /// through the balancer to the others).
    fn drain(&self, index: usize) {
        for command in [
            format!("set server replicas/r{index} state drain"),
            format!("shutdown sessions server replicas/r{index}"),
        ] {
            let answer = self.admin(&command);
            assert!(answer.trim().is_empty(), "`{command}`: {answer}");
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ops of each bucket a replica holds, by name.
fn ops_per_bucket(replica: &Cluster) -> std::collections::BTreeMap<String, u64> {
    buckets(replica)
        .lines()
        .map(|l| {
            let mut words = l.split(' ');
            (
                words.next().unwrap().to_owned(),
                words.next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// Ops written into the client's buckets between two listings.
fn churn_in(
    held: &[String],
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> u64 {
    held.iter()
        .map(|name| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0))
        .sum()
}

#[test]
fn a_client_moves_between_seeded_replicas_behind_haproxy_without_downloading_again() {
    testkit::require_sdk_client();
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let source = FixtureSource::start(&install, &dir);
    let ports = [free_port(), free_port(), free_port()];
    let a = source.replica(&install, &dir, "ha_a", ports[0], None);
    // The balancer knows all three; only A is up, so the client syncs from A.
    let port_lb = free_port();
    let balancer = Balancer::start(&dir, port_lb, &ports);
    let db_dir = tempfile::tempdir().unwrap();
    let mut client = source.client(port_lb, db_dir.path());
    source.wait_equal(&mut client, "the first sync through HAProxy, from A");
    // B and C join, seeded from A while A serves.
    let b = source.replica(&install, &dir, "ha_b", ports[1], Some(ports[0]));
    let c = source.replica(&install, &dir, "ha_c", ports[2], Some(ports[0]));
    // A local write, uploaded and acknowledged by a write checkpoint.
    client.send(&serde_json::json!({"cmd": "update", "table": "tasks",
        "id": "task-org-001-0002-0005", "set": {"title": "Closed on the client"}}));
    client.send(&serde_json::json!({"cmd": "wait_synced_after_upload"}));
    source
        .primary
        .sql("UPDATE tasks SET priority = priority + 1 WHERE id LIKE 'task-org-001-0001-%'");
    source.wait_equal(&mut client, "a change followed through HAProxy");
    assert!(
        metric(ports[0], "powersync_mdbx_sync_streams_open") > 0,
        "the client is on A"
    );
    let held: Vec<String> = client.send(&serde_json::json!({"cmd": "dump"}))["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap_or_default().to_owned())
        .collect();
    for replica in [&a, &b, &c] {
        replica.wait_applied(&source.primary);
    }
    assert_eq!(buckets(&b), buckets(&a), "B holds A's history");
    assert_eq!(buckets(&c), buckets(&a), "C holds A's history");
    let full: u64 = held.iter().map(|n| ops_per_bucket(&a)[n]).sum();

    // A goes down for good; B or C takes the client.
    let sent = |port: u16| metric(port, "powersync_mdbx_sync_ops_sent_total");
    let sent_before = [sent(ports[1]), sent(ports[2])];
    let before = ops_per_bucket(&b);
    a.stop_immediate();
    source
        .primary
        .sql("UPDATE tasks SET status = 'done' WHERE id LIKE 'task-org-001-0003-000%'");
    b.wait_applied(&source.primary);
    c.wait_applied(&source.primary);
    source.wait_equal(&mut client, "the churn after the failover");
    let after = ops_per_bucket(&b);
    let churn = churn_in(&held, &before, &after);
    let sent_after = [sent(ports[1]), sent(ports[2])];
    let failover_sent = sent_after[0] - sent_before[0] + sent_after[1] - sent_before[1];
    eprintln!(
        "failover: {failover_sent} ops sent; the churn wrote {churn} in the client's {} buckets \
         (a full download: {full})",
        held.len()
    );
    assert!(
        churn > 0 && full >= 20 * churn,
        "a full download ({full}) is ≥ 20× the churn ({churn})"
    );
    assert_eq!(
        failover_sent, churn,
        "after the failover the client received the churn's ops only, not its buckets again"
    );

    // The replica holding the client is drained; the other takes it, again without a
    // download.
    let (drained, other) = if metric(ports[1], "powersync_mdbx_sync_streams_open") > 0 {
        (1, 2)
    } else {
        (2, 1)
    };
    let other_before = sent(ports[other]);
    let before = after;
    balancer.drain(drained);
    source
        .primary
        .sql("UPDATE tasks SET priority = priority - 1 WHERE id LIKE 'task-org-001-0002-001%'");
    b.wait_applied(&source.primary);
    c.wait_applied(&source.primary);
    source.wait_equal(&mut client, "the churn after the drain");
    let churn = churn_in(&held, &before, &ops_per_bucket(&b));
    let drain_sent = sent(ports[other]) - other_before;
    eprintln!("drain: {drain_sent} ops sent by the other replica; the churn wrote {churn}");
    assert!(churn > 0);
    assert_eq!(drain_sent, churn, "after the drain: the churn's ops only");
    testkit::wait_until("the drained replica to hold no stream", || {
        (metric(ports[drained], "powersync_mdbx_sync_streams_open") == 0).then_some(())
    });

    // Each cut connection shows as one; no checksum failed.
    let dump = client.send(&serde_json::json!({"cmd": "dump"}));
    let warnings = dump["warnings"].as_array().unwrap();
    eprintln!("SDK warnings: {warnings:?}");
    assert_eq!(checksum_warnings(&dump), Vec::<serde_json::Value>::new());
    assert!(
        warnings.iter().all(|w| {
            w["text"]
                .as_str()
                .unwrap_or_default()
                .contains("terminated")
        }),
        "the SDK logged more than the cut connections: {warnings:?}"
    );
    client.finish();
}
