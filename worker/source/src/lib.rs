//! The replication source: the primary PostgreSQL server.
//!
//! Ordinary connections (validation, snapshot COPY, write checkpoints) use
//! `tokio-postgres` with rustls; the replication connection (slot, pgoutput stream) uses
//! `pg_walstream`. Both follow the configured `sslmode`, and a certificate that fails
//! verification is a configuration error, never retried.
#![warn(missing_docs)]

mod client;
mod copy_text;
mod error;
mod head;
mod instance;
mod partition;
mod pgoutput;
mod slot;
mod snapshot;
mod tls;
mod validate;
mod walsender;

pub use client::{connect, replication_uri};
pub use copy_text::{CopyFields, CopyTextError, Fields};
pub use error::SourceError;
pub use head::{
    emit_marker, write_checkpoint_message, PrimaryHead, FAIL_FAST_FOR, HEAD_CONNECTIONS,
    HEAD_DEADLINE,
};
pub use instance::{
    connection_schema, slot_budget, table_status, DatabaseSchema, SchemaColumn, SchemaTable,
    SlotBudget,
};
pub use partition::{table_partitions, Partition};
pub use pgoutput::{Message, Pgoutput, PgoutputError, Relation, RelationColumn, Tuple, Value};
pub use slot::{
    create_slot, create_slot_after_loss, create_temporary_slot, drop_slot, format_lsn,
    make_failover_slot, parse_lsn, replication_error, slot_info, start_stream, ExportedSlot,
    SlotInfo,
};
pub use snapshot::{
    copy_table, enter_snapshot, estimated_rows, table_columns, within, ColumnMeta, CopyRows,
};
pub use tls::{install_crypto_provider, root_store};
pub use validate::{
    published_tables, published_with_prefix, validate_primary, PrimaryInfo, ReplicaIdentity,
    SourceTable, TableInfo, PUBLICATION,
};
pub use walsender::{
    primary_identity, slot_walsender, terminate_backend, wal_sender_timeout, PrimaryIdentity,
    SlotWalsender,
};
