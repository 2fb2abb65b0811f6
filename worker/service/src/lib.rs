//! The sync service without a transport: the request body, the streamed lines and their
//! encodings, the per-connection session that turns store checkpoints into lines, the
//! registry of open streams, write checkpoints, and the generation being served
//! ([`SyncService`]). HTTP and the admin socket are adapters over it. See
//! `docs/protocol.md`.
#![warn(missing_docs)]

pub mod admin_api;
mod checkpoint_state;
mod emit;
pub mod error;
pub mod inspect;
pub mod lines;
mod lookups;
pub mod paging;
pub mod readers;
mod registry;
pub mod request;
mod service;
pub mod session;
mod user_rate;
pub mod wakeups;
pub mod write_checkpoint;

pub use admin_api::{AdminApi, AdminError, ConfigInUse, ReprocessRequest, SyncConfigs};
pub use checkpoint_state::{RequestLimits, DEFAULT_MAX_PARAMETER_RESULTS};
pub use emit::Encoding;
pub use error::SyncError;
pub use lines::{
    BucketChecksum, CheckpointDiffLine, CheckpointLine, DataLine, StreamDescription, StreamError,
    SyncLine,
};
pub use paging::Budgets;
pub use registry::{Registration, StreamInfo, StreamRegistry, UserStreamsFull};
pub use request::{
    BucketPosition, KeptRequest, StreamSubscription, SyncRequest, MAX_BODY_BYTES,
    MAX_BUCKET_POSITIONS, MAX_CLIENT_ID_BYTES, MAX_PARAMETERS_BYTES, MAX_SUBSCRIPTIONS,
    MAX_SUBSCRIPTIONS_BYTES,
};
pub use service::{
    Served, StreamLimits, SyncService, CONNECTION_OUTCOMES, MAX_CONCURRENT_READS, MAX_STREAMS,
    MAX_STREAMS_PER_USER,
};
pub use session::SyncSession;
pub use user_rate::UserRate;
pub use wakeups::{Subscription, Wakeups};
