//! Replication: the bootstrap (slot, exported snapshot, COPY into the store) now; the
//! pgoutput stream follows the same path in the next stage.

mod apply;
mod bootstrap;
mod error;
mod intent;
mod pipeline;
#[cfg(test)]
mod pipeline_cost;
#[cfg(test)]
mod pipeline_tests;
mod progress;
mod release;
mod stream;
mod toast;

pub use apply::StreamProgress;
pub use bootstrap::{bootstrap, BootstrapOutcome, SourcePlan};
pub use error::ReplicationError;
pub use intent::{BootstrapIntent, BootstrapState, IntentTable};
pub use progress::Progress;
pub use release::{release_intent_slot, release_slot};
pub use stream::{follow_slot, StreamContext};
