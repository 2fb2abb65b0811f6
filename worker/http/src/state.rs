//! What every handler sees of the engine: [`HttpState`].

use std::sync::Arc;

use service::{AdminApi, SyncService};

use super::peer_gate::PeerGate;
use status::StatusCell;

/// What handlers can see.
#[derive(Clone)]
pub struct HttpState {
    /// The engine's status (readiness, liveness).
    pub status: Arc<StatusCell>,
    /// The sync endpoints.
    pub sync: Arc<SyncService>,
    /// The admin API (`api.tokens`).
    pub admin: Arc<AdminApi>,
    /// Who may copy the store (`powersync_mdbx.peer_secret_file`); `None`: no peer
    /// endpoint.
    pub peer: Option<Arc<PeerGate>>,
}
