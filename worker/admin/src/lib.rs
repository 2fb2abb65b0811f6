//! The admin socket: a Unix-domain socket the engine serves beside the HTTP server, so SQL
//! backends can ask the live engine what only its store and connections know
//! (`powersync_mdbx.buckets()`, `user_buckets()`, `streams()`) without opening MDBX.
//! One JSON request line in, one JSON response line out, then the connection closes.
#![warn(missing_docs)]

mod answer;
pub mod client;
mod error;
pub mod protocol;
mod server;

pub use client::call;
pub use error::AdminError;
pub use protocol::{AdminRequest, AdminResponse, BucketRow, UserBucketRow, SOCKET_NAME};
pub use server::{bind, serve};
