//! What every handler sees of the engine: [`HttpState`].

use std::sync::Arc;

use service::SyncService;
use status::StatusCell;

/// What handlers can see.
#[derive(Clone)]
pub struct HttpState {
    /// The engine's status (readiness, liveness).
    pub status: Arc<StatusCell>,
    /// The sync endpoints.
    pub sync: Arc<SyncService>,
    /// SHA-256 of `powersync_mdbx.peer_secret`; `None`: no peer endpoint.
    pub peer_secret: Option<[u8; 32]>,
}
