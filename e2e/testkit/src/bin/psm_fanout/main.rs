//! `psm-fanout`: a load generator for the sync service's fan-out (issue 26). It opens many
//! `/sync/stream` connections over raw HTTP/1.1, one user per stream (HS256 tokens), spread
//! over several loopback source addresses, decodes their responses (chunked, zstd, gzip)
//! and prints one JSON object of what it measured. It reports; it asserts no timing.
//!
//! ```text
//! psm-fanout open     --port P --secret S --audience A [--streams N] [--coding zstd]
//!                     [--quiet-seconds 5] [--commit-cmd "psql -c ..."]
//! psm-fanout per-user --port P --secret S --audience A --primary "host=... port=..."
//!                     [--streams N] [--rate 1000] [--seconds 20] [--pg-connections 16]
//! ```
//!
//! Common flags: `--worker-pid` (the sync worker: its `RssAnon` and CPU time are read
//! around each phase), `--host` (127.0.0.1), `--user-prefix` (`u`: stream `i` is user `u<i>`),
//! `--connects` (connections being set up at once, 256), `--sources` (source addresses
//! 127.0.0.2 on, 8), `--timeout` (seconds each phase may wait, 300), `--threads` (2).
//! `scripts/bench_fanout.sh` runs every scenario against a throwaway replica.

mod body;
mod conn;
mod flags;
mod open;
mod per_user;
mod stats;
mod streams;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::flags::{Common, Flags};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("psm-fanout: {e}\n\nusage: psm-fanout open|per-user --port P --secret S --audience A [flags]\n(see the module documentation in e2e/testkit/src/bin/psm_fanout/main.rs)");
            std::process::exit(2);
        }
    }
}

fn run(args: &[String]) -> Result<serde_json::Value, String> {
    let (scenario, rest) = args.split_first().ok_or("no scenario given")?;
    let mut flags = Flags::parse(rest)?;
    let host = flags.take("--host").unwrap_or_else(|| "127.0.0.1".into());
    let port: u16 = flags.parsed("--port")?.ok_or("--port is required")?;
    let addr: SocketAddr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let coding = flags.take("--coding").unwrap_or_else(|| "identity".into());
    let accept_encoding = match coding.as_str() {
        "identity" => None,
        "zstd" | "gzip" => Some(coding.clone()),
        other => return Err(format!("--coding {other}: identity, zstd or gzip")),
    };
    let common = Common {
        streams: flags.parsed("--streams")?.unwrap_or(1000),
        secret: flags.required("--secret")?,
        audience: flags.required("--audience")?,
        user_prefix: flags.take("--user-prefix").unwrap_or_else(|| "u".into()),
        token_seconds: flags.parsed("--token-seconds")?.unwrap_or(3600),
        connects: flags.parsed("--connects")?.unwrap_or(256),
        sources: flags.parsed("--sources")?.unwrap_or(8),
        timeout: Duration::from_secs_f64(flags.parsed("--timeout")?.unwrap_or(300.0)),
        coding,
        worker_pid: flags.parsed("--worker-pid")?,
    };
    let threads: usize = flags.parsed("--threads")?.unwrap_or(2);
    let mut target = conn::Target {
        addr,
        accept_encoding,
        marker_prefix: None,
    };
    enum Scenario {
        Open(open::Open),
        PerUser(per_user::PerUser),
    }
    let scenario = match scenario.as_str() {
        "open" => Scenario::Open(open::Open::from_flags(&mut flags)?),
        "per-user" => {
            target.marker_prefix = Some(per_user::MARKER.as_bytes().to_vec());
            Scenario::PerUser(per_user::PerUser::from_flags(&mut flags)?)
        }
        other => return Err(format!("unknown scenario {other} (open, per-user)")),
    };
    flags.finish()?;
    let files = raise_open_files();
    if files < common.streams as u64 + 64 {
        eprintln!(
            "psm-fanout: {files} descriptors allowed (the hard limit), fewer than {} streams need",
            common.streams
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut report = runtime.block_on(async {
        match scenario {
            Scenario::Open(open) => open.run(&common, target).await,
            Scenario::PerUser(per_user) => per_user.run(&common, target).await,
        }
    });
    open::merge(
        &mut report,
        serde_json::json!({ "open_files_limit": files }),
    );
    // Thousands of connections close with the process, not one by one.
    std::mem::forget(runtime);
    Ok(report)
}

/// Raises the soft limit of open descriptors to the hard limit; returns the soft limit now.
fn raise_open_files() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the local struct it is given a valid pointer to.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the local struct it is given a valid pointer to.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
    }
    limit.rlim_cur
}
