//! The decoded source changes the stream hands the applier ([`Change`]), and the
//! write-checkpoint notes among them.

use std::time::Instant;

use crate::copied::RecopyEvent;
use crate::error::ReplicationError;
use crate::row::PreparedRow;
use crate::table::{rebind, StreamTable};
use rules::SyncRules;
use source::{ColumnMeta, Partition, Tuple};

/// A decoded source change, addressed to a table by its index in the applier's list.
#[derive(Debug)]
pub(super) enum Change {
    /// A source transaction starts; `commit_lsn` is where it commits.
    Begin {
        commit_lsn: u64,
    },
    /// Row changes carry their tuples with values in the table's column order, and the
    /// new row evaluated and packed when the stream's task could (`prepare`).
    Insert {
        table: usize,
        new: Tuple,
        prepared: Option<Box<PreparedRow>>,
    },
    Update {
        table: usize,
        /// Boxed: most updates have none (their key did not change), and a change is moved
        /// several times on its way to the store.
        old: Option<Box<Tuple>>,
        new: Tuple,
        prepared: Option<Box<PreparedRow>>,
    },
    Delete {
        table: usize,
        old: Tuple,
    },
    Truncate {
        tables: Vec<usize>,
    },
    /// From here on the table's rows come with these columns (a Relation message that
    /// added, dropped, renamed or retyped columns). `recopy`: a column the rules read
    /// changed, or the partitions of a partitioned table, so the table's rows are copied
    /// again (see `merge`).
    Relation {
        table: usize,
        oid: u32,
        /// The replica identity columns, in key order.
        identity: Vec<String>,
        columns: Vec<ColumnMeta>,
        /// A partitioned table's partitions changed: the ones it has now.
        repartitioned: Option<Vec<Partition>>,
        recopy: bool,
        /// The replica identity changed: the one the stored rows are keyed by.
        rekey_from: Vec<String>,
        /// Why the table is copied again (empty without `recopy`).
        why: String,
    },
    /// A table the stream follows from here on (the rules read it through a wildcard
    /// table): it takes the next index, `index`, and its rows are copied (see `recopy`).
    Added {
        index: usize,
        table: Box<StreamTable>,
    },
    /// The table is gone from the primary under its name (renamed, dropped, or out of the
    /// publication): its rows leave the buckets; a table published under its name again
    /// comes as a `Relation` with `recopy`.
    Gone {
        table: usize,
    },
    /// A table's re-copy, between transactions (see `recopy`).
    Recopy(RecopyEvent),
    /// The transaction ends; the store commits with `end_lsn`. `received` is when the
    /// Commit message arrived from the primary.
    Commit {
        end_lsn: u64,
        received: Instant,
    },
    /// Every source transaction that commits below `lsn` was delivered (a logical message
    /// of this service, [`MESSAGE_PREFIX`], outside any transaction): the checkpoint's LSN
    /// moves up with no new ops.
    Advance {
        lsn: u64,
        /// The message was a write-checkpoint request made on any replica of the primary
        /// (`WriteCheckpointNote`): recorded here too.
        write_checkpoint: Option<WriteCheckpointNote>,
    },
    /// Like [`Change::Advance`], for a logical message of another prefix (another tool's
    /// heartbeat, say): nothing is recorded, and the position is stored with the next
    /// write rather than in a commit of its own (`apply`'s `PASS_EVERY`).
    Passed {
        lsn: u64,
    },
}

/// The prefix of this service's logical messages (write-checkpoint notes, sync points and
/// markers, `source::PrimaryHead`): the stream stores the position of each, while other
/// prefixes only move it.
pub(crate) const MESSAGE_PREFIX: &str = "powersync";

/// A write-checkpoint request as the replica that answered it announces it to every
/// replica of the primary: a logical message (prefix `powersync`) with the content
/// `write-checkpoint <record key> <LSN> [<id>]` (the id when it is not the LSN: a
/// checkpoint request's). The record key is the SHA-256 of the user and client ids
/// (`service::write_checkpoint::record_key`), never the ids themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteCheckpointNote {
    /// The stage-record key (`write_checkpoint/` and 64 hex digits).
    pub key: String,
    /// The LSN asked for, at most the message's own LSN: a forged message can only
    /// make a request wait for what is already applied when it is.
    pub lsn: u64,
    /// The id reported once `lsn` is reached.
    pub id: u64,
}

impl WriteCheckpointNote {
    /// The note a message's `content` at `message_lsn` carries; `None` for any other
    /// message, or a key that is not a write-checkpoint record's.
    pub fn parse(content: &[u8], message_lsn: u64) -> Option<Self> {
        let text = std::str::from_utf8(content).ok()?;
        let mut words = text.strip_prefix("write-checkpoint ")?.split(' ');
        let (key, lsn) = (words.next()?, words.next()?.parse::<u64>().ok()?);
        let id = match words.next() {
            Some(id) => id.parse::<u64>().ok()?,
            None => lsn,
        };
        let digest = key.strip_prefix(store::WRITE_CHECKPOINT_PREFIX)?;
        let valid = words.next().is_none()
            && digest.len() == 64
            && digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        valid.then(|| Self {
            key: key.to_owned(),
            lsn: lsn.min(message_lsn),
            id,
        })
    }

    /// Records it in `w`'s transaction unless a request of the same key with this id or
    /// a later one, for this LSN or a later one, is stored already.
    pub(super) fn record(&self, w: &store::WriteTxn<'_, '_>) -> Result<(), store::StoreError> {
        let stored = w
            .stage_record(&self.key)?
            .and_then(|v| store::WriteCheckpointRecord::decode(&v));
        if stored.is_some_and(|s| s.id >= self.id && s.lsn >= self.lsn) {
            return Ok(());
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (lsn, id) = stored.map_or((self.lsn, self.id), |s| {
            (s.lsn.max(self.lsn), s.id.max(self.id))
        });
        w.put_stage_record(
            &self.key,
            &store::WriteCheckpointRecord::encode_with_id(lsn, now, id),
        )
    }
}

impl Change {
    /// True for the changes of rows (what `StreamProgress::received` counts).
    pub(super) fn is_row_change(&self) -> bool {
        matches!(
            self,
            Self::Insert { .. } | Self::Update { .. } | Self::Delete { .. } | Self::Truncate { .. }
        )
    }
}

/// [`rebind`] with what a [`Change::Relation`] carries (other changes bind nothing).
pub(super) fn rebind_to(
    tables: &mut [StreamTable],
    change: &Change,
    rules: &SyncRules,
) -> Result<(), ReplicationError> {
    match change {
        Change::Relation {
            table,
            oid,
            identity,
            columns,
            repartitioned,
            ..
        } => rebind(
            tables,
            *table,
            *oid,
            identity.clone(),
            columns.clone(),
            repartitioned.clone(),
            rules,
        ),
        _ => Ok(()),
    }
}
