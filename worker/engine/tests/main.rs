//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-engine`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_engine as engine;

mod disk_full;
mod engine_rig;
mod limits;
mod metrics_http;
mod reads_stay_up;
mod rotation;
mod rules_deploy;
mod seeding;
mod source_stall;
mod stream_log;
mod sync_client;
mod sync_http;
mod sync_socket;
