//! Sync rules: the YAML front end, the SQL subset compiler and the row and request
//! evaluators. It depends on no other crate of the project.
//!
//! Flow: [`SyncRules::parse`] checks the YAML (`yaml`), parses every query with a real SQL
//! parser (`sql`) and compiles it (`compile`) into per-table [`TablePlan`]s (replication
//! time: row → bucket memberships and lookup entries) and request resolvers (sync time:
//! token, parameters, subscriptions → bucket names). Values follow the official service's
//! SQLite model ([`value`], [`types`]) so `data` strings, bucket names and checksums
//! ([`checksum`]) are byte-identical to it. See `docs/sync-rules.md`.
#![warn(missing_docs)]

pub mod bucket;
pub(crate) mod cast;
pub mod checksum;
pub(crate) mod compile;
pub(crate) mod dates;
pub mod error;
pub(crate) mod eval;
pub(crate) mod expr;
pub mod fingerprint;
pub(crate) mod functions;
pub(crate) mod geometry;
pub(crate) mod js_number;
pub mod json;
pub mod lookup_bytes;
pub(crate) mod lookup_groups;
pub mod options;
pub mod plan;
pub mod request;
pub mod row;
pub(crate) mod sql;
pub mod sync_rules;
pub mod types;
pub mod validate;
pub mod value;
pub mod warning;
pub(crate) mod yaml;

pub use bucket::{bucket_name, BucketVersion};
pub use checksum::{add_checksums, put_checksum};
pub use compile::events::EventDefinition;
pub use error::{RulesError, SqlLocation};
pub use eval::SlotBinding;
pub use fingerprint::Fingerprint;
pub use lookup_bytes::{decode_lookup_outputs, encode_lookup_outputs};
pub use options::Compatibility;
pub use plan::{BucketRow, LookupEntry, LookupKey, RowEvaluation, RowObject, TablePlan, TableRef};
pub use request::{
    BucketReason, Claims, InMemoryLookups, LookupReader, RequestContext, Resolution,
    ResolvedBucket, Subscription, SubscriptionError,
};
pub use row::{OwnedSourceRow, SourceColumn, SourceRow};
pub use sync_rules::{
    BucketSource, SourceKind, SyncRules, TableUsage, DEFAULT_MAX_BUCKETS, DEFAULT_PRIORITY,
};
pub use types::{sqlite_type, PgType};
pub use value::{OwnedValue, Value};
pub use warning::{RulesWarning, WarningKind};
