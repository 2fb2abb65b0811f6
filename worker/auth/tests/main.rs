//! The integration tests of this crate, one test binary (`cargo test -p powersync-mdbx-auth`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_auth as auth;

mod tokens;
