//! The bootstrap record, written to the store before the slot exists and updated as the
//! bootstrap advances, so a restart knows which slot is its own and whether the snapshot
//! finished.

use serde::{Deserialize, Serialize};

use crate::error::ReplicationError;
use store::{ReadTxn, StoreError, WriteTxn};

/// Stage-record key in the store.
const KEY: &str = "bootstrap";
/// Stage-record key of the rules text the data is built with.
const RULES_KEY: &str = "rules";

/// How far the bootstrap got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BootstrapState {
    /// The intent is durable; the slot may or may not exist yet.
    CreatingSlot,
    /// The slot exists; tables are being copied.
    Snapshotting,
    /// Every table is copied and committed with the consistent point.
    Complete,
}

/// A source table and the id the store knows it by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentTable {
    /// Store table id.
    pub id: u32,
    /// Schema.
    pub schema: String,
    /// Name.
    pub name: String,
    /// The columns as the snapshot copied them; a stream whose Relation message differs
    /// is refused (rows are never decoded with a stale schema).
    #[serde(default)]
    pub columns: Vec<source::ColumnMeta>,
    /// The replica identity columns, in key order.
    #[serde(default)]
    pub identity: Vec<String>,
    /// The table's OID on the primary (pgoutput addresses relations by it).
    #[serde(default)]
    pub oid: u32,
    /// Its columns changed in a way the rules see and its rows are being re-copied
    /// (`columns` are the new ones); a restart starts the re-copy again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recopy: bool,
    /// During a re-copy after the replica identity changed: the identity the stored rows
    /// are still keyed by (each moves to its new key as the re-copy or the stream meets
    /// it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rekey_from: Vec<String>,
    /// The table is gone from the primary under its name (renamed, dropped, or taken out of
    /// the publication): its rows were removed from the buckets, and it is copied again
    /// when a table of its name is published again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
    /// A partitioned table's partitions as its last copy saw them (`None`: not
    /// partitioned): when they change (one attached, detached, dropped or emptied alone),
    /// its rows change with no change on the stream, and it is copied again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<source::Partition>>,
}

fn first_generation() -> u64 {
    1
}

/// Who the stored data belongs to and how far its bootstrap went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapIntent {
    /// The primary's `system_identifier`.
    pub system_identifier: String,
    /// The primary's timeline when the slot was created (`None` in stores built before
    /// it was recorded): a slot gone on a later timeline was lost to a failover.
    #[serde(default)]
    pub timeline: Option<u32>,
    /// Database on the primary.
    pub database: String,
    /// The slot this store owns.
    pub slot: String,
    /// The publication read.
    pub publication: String,
    /// SHA-256 (hex) of the sync rules the data was built with.
    pub rules_hash: String,
    /// The generation number of the store the data was built in (a store of an earlier
    /// build, with no history id, names its buckets with it).
    #[serde(default = "first_generation")]
    pub generation: u64,
    /// Tables and their store ids.
    pub tables: Vec<IntentTable>,
    /// Progress.
    pub state: BootstrapState,
    /// The slot's consistent point, once the slot exists.
    pub consistent_point: Option<u64>,
    /// Rows copied, once complete.
    pub rows: u64,
    /// The slot was lost and the store is being rebuilt from a new one (`resync`); a
    /// restart rebuilds again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebuilding: bool,
}

impl BootstrapIntent {
    /// The stage-record key it is stored under.
    pub const KEY: &'static str = KEY;
    /// The stage-record key of the rules text (see [`Self::load_rules_text`]).
    pub const RULES_KEY: &'static str = RULES_KEY;

    /// The record of a store about to create its slot on `primary`.
    pub(super) fn creating_slot(
        primary: &source::PrimaryInfo,
        plan: &crate::plan::SourcePlan,
        rules_hash: String,
        generation: u64,
        tables: Vec<IntentTable>,
    ) -> Self {
        Self {
            system_identifier: primary.system_identifier.clone(),
            timeline: Some(primary.timeline),
            database: plan.connection.database.clone(),
            slot: plan.slot.clone(),
            publication: source::PUBLICATION.to_owned(),
            rules_hash,
            generation,
            tables,
            state: BootstrapState::CreatingSlot,
            consistent_point: None,
            rows: 0,
            rebuilding: false,
        }
    }

    /// Reads the record, if any.
    pub fn load(view: &ReadTxn<'_, '_>) -> Result<Option<Self>, ReplicationError> {
        let Some(bytes) = view.stage_record(KEY)? else {
            return Ok(None);
        };
        Self::decode(&bytes).map(Some)
    }

    /// The record from its stored bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, ReplicationError> {
        serde_json::from_slice(bytes).map_err(|e| ReplicationError::Ownership {
            code: "PSM_B1000",
            message: format!(
                "the stored bootstrap record does not parse ({e}), so the slot the store owns \
                 is not known: drop it on the primary by hand (pg_replication_slots, named \
                 like powersync_mdbx.slot_name), then run SELECT \
                 powersync_mdbx.reset(force => true)"
            ),
        })
    }

    /// The record as stored (JSON).
    pub fn encode(&self) -> Result<Vec<u8>, ReplicationError> {
        serde_json::to_vec(self).map_err(|e| ReplicationError::Ownership {
            code: "PSM_B1009",
            message: format!(
                "cannot encode the bootstrap record ({e}); this is a bug, please report it"
            ),
        })
    }

    /// The rules text the stored data was built with (`None` for stores built before the
    /// text was recorded: their rules are known only by [`Self::rules_hash`]).
    pub fn load_rules_text(view: &ReadTxn<'_, '_>) -> Result<Option<String>, ReplicationError> {
        match view.stage_record(RULES_KEY)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes).map(Some).map_err(|_| {
                ReplicationError::Store(StoreError::corrupt(view.dir(), "rules record"))
            }),
        }
    }

    /// Records the rules text the data is built with, in `write`'s transaction.
    pub fn save_rules_text(text: &str, write: &WriteTxn<'_, '_>) -> Result<(), StoreError> {
        write.put_stage_record(RULES_KEY, text.as_bytes())
    }

    /// Writes an [`encode`](Self::encode)d record in `write`'s transaction.
    pub fn save(encoded: &[u8], write: &WriteTxn<'_, '_>) -> Result<(), StoreError> {
        write.put_stage_record(KEY, encoded)
    }

    /// Changes the record of the table with store id `store_id` in `write`'s transaction.
    pub(super) fn update_table(
        write: &WriteTxn<'_, '_>,
        store_id: u32,
        change: impl FnOnce(&mut IntentTable),
    ) -> Result<(), ReplicationError> {
        Self::rewrite(write, |intent| {
            let table = intent
                .tables
                .iter_mut()
                .find(|t| t.id == store_id)
                .ok_or_else(|| {
                    ReplicationError::Store(StoreError::corrupt(
                        write.dir(),
                        "a streamed table missing from the bootstrap record",
                    ))
                })?;
            change(table);
            Ok(())
        })
    }

    /// Adds the record of a table the stream follows from now on, in `write`'s transaction.
    pub(super) fn add_table(
        write: &WriteTxn<'_, '_>,
        table: IntentTable,
    ) -> Result<(), ReplicationError> {
        Self::rewrite(write, |intent| {
            intent.tables.retain(|t| t.id != table.id);
            intent.tables.push(table);
            Ok(())
        })
    }

    /// Changes the stored record in `write`'s transaction.
    fn rewrite(
        write: &WriteTxn<'_, '_>,
        change: impl FnOnce(&mut Self) -> Result<(), ReplicationError>,
    ) -> Result<(), ReplicationError> {
        let bytes = write.stage_record(KEY)?.ok_or_else(|| {
            ReplicationError::Store(StoreError::corrupt(write.dir(), "bootstrap record missing"))
        })?;
        let mut intent = Self::decode(&bytes)?;
        change(&mut intent)?;
        Self::save(&intent.encode()?, write)?;
        Ok(())
    }

    /// The store id of `schema.name`.
    pub fn table_id(&self, schema: &str, name: &str) -> Option<u32> {
        self.tables
            .iter()
            .find(|t| t.schema == schema && t.name == name)
            .map(|t| t.id)
    }
}
