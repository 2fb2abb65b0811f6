//! Replication: the bootstrap (slot, exported snapshot, COPY through the evaluator
//! pipeline into the store) and the stream (pgoutput changes applied one source
//! transaction per store commit). Both write evaluated rows through [`StoreInput`].
#![warn(missing_docs)]

mod apply;
mod bootstrap;
mod catalog;
mod change;
mod context;
mod copied;
mod covered;
mod deploy;
mod error;
mod expiry;
#[doc(hidden)]
pub mod fuzzing;
mod handoff;
mod intent;
mod liveness;
mod merge;
mod pipeline;
mod plan;
mod prepare;
mod progress;
mod recopy;
mod release;
mod resync;
mod row;
mod seed;
mod store_input;
mod stream;
mod table;
mod toast;

pub use apply::GROUP_WINDOW;
pub use bootstrap::{bootstrap, bootstrap_with, BootstrapOutcome, Start};
pub use context::{StreamContext, GONE_AFTER};
pub use deploy::{abandon_deploy, begin_deploy, deploy_in_progress, finish_deploy};
pub use error::ReplicationError;
pub use expiry::WRITE_CHECKPOINT_MAX_AGE;
pub use intent::{BootstrapIntent, BootstrapState, IntentTable};
pub use liveness::Liveness;
pub use plan::SourcePlan;
pub use progress::{
    Progress, RebuildDone, RebuildProgress, RecopyProgress, SourceHeard, StreamProgress,
};
pub use release::release_intent_slot;
pub use seed::{seed, SeedSource, Seeded};
pub use store_input::StoreInput;
pub use stream::follow_slot;
