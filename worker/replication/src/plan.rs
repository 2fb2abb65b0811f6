//! Where replication reads from: the primary's connection and the slot this replica owns.

use config::SourceConnection;

/// Where to replicate from.
#[derive(Debug, Clone)]
pub struct SourcePlan {
    /// The primary.
    pub connection: SourceConnection,
    /// The slot this sync replica owns.
    pub slot: String,
}
