//! Test rig: throwaway PostgreSQL clusters (a primary with `wal_level=logical`, a sync
//! replica with the extension preloaded) in temporary directories, on free loopback ports
//! and private socket directories. When the tests run as root, the clusters run as an
//! unprivileged system user (PostgreSQL refuses root). Every cluster is stopped (by its
//! postmaster pid) when its value is dropped, even when a test fails.

// A test rig reports set-up failures by panicking the test that asked for them.
#![allow(clippy::expect_used)]

#[cfg(feature = "buckets")]
pub mod buckets;
mod certs;
mod cli;
mod cluster;
mod disk;
mod held;
mod http;
mod install;
mod jwt;
mod ports;
mod proxy;
mod sdk;
mod sync_stream;
mod wait;

pub use certs::{ServerCert, TestCa};
pub use cli::{CliRun, OfficialCli};
pub use cluster::{Cluster, ClusterKind, TestDir};
pub use disk::SmallDisk;
pub use held::HeldTransaction;
pub use http::{http_get, http_post, HttpReply};
pub use install::PgInstall;
pub use jwt::{base64_url, global_bucket_config, hs256_token, rules_config};
pub use ports::free_port;
pub use proxy::TcpProxy;
pub use sdk::{require_sdk_client, sdk_client_installed, SdkClient, WatchClient};
pub use sync_stream::SyncStreamReader;
pub use wait::{
    wait_for, wait_for_future, wait_until, worker_progress, LiveTestTimer, Patience, Waiting,
};

/// The benchmark fixture kept in the repository (`e2e/fixture/`).
pub fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixture")
}
