//! Decoding pgoutput messages into [`Change`]s for the tables the rules read: a row's
//! tuples put in the table's column order, Relation messages checked (see `shape`), the
//! commit positions the stream has passed noted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::change::{Change, WriteCheckpointNote, MESSAGE_PREFIX};
use crate::context::GONE_AFTER;
use crate::error::{stream_error, ReplicationError};
use crate::table::StreamTable;
use metrics::PendingCommits;
use rules::SyncRules;
use source::{Message, Pgoutput, Tuple};

/// Whose Relation message was the last message: the next Relation message, of a relation
/// the stream does not follow, is then one of its partitions' (pgoutput sends none other
/// in a row, but for the tables one TRUNCATE names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Described {
    /// A partitioned table the stream follows, by index.
    Partitioned(usize),
    /// Any other relation: a partition after it is one of a partitioned table the stream
    /// does not follow (published under that table's name, never its own).
    Other,
}

/// pgoutput messages → changes for the tables the rules read.
pub(crate) struct Decoder<'a> {
    /// The session's messages as read, with the relations they described.
    pub(super) pgoutput: Pgoutput,
    /// Per table: for each of its columns, where the value sits in the tuples of its
    /// relation's last Relation message (`None` until needed after a change of either).
    pub(super) layouts: Vec<Option<Vec<Option<usize>>>>,
    /// Where each transaction's Begin is noted for the lag in seconds.
    pending: &'a PendingCommits,
    /// The tables as their rows come now (the snapshot's columns, then each Relation
    /// message's the rules do not see); the applier keeps its own copy in step.
    pub(super) tables: Vec<StreamTable>,
    pub(super) rules: &'a SyncRules,
    pub(super) by_oid: HashMap<u32, usize>,
    pub(super) by_name: HashMap<String, usize>,
    pub(super) in_transaction: bool,
    /// Every source transaction committing below this LSN has been decoded.
    pub(super) passed: u64,
    /// The commit LSN of the transaction being decoded.
    pub(super) commit_lsn: u64,
    /// Per table, the commit LSN of the transaction whose Relation message described it
    /// last (0: none yet).
    pub(super) described_at: Vec<u64>,
    /// The tables missing under their name (not gone yet), by index: since when.
    pub(super) missing_since: std::collections::BTreeMap<usize, Instant>,
    /// How long a missing table's rows stay served.
    pub(super) gone_after: Duration,
    /// Per table, where the stream learned the partitions it knows of it (see
    /// `partitions`; 0: from the snapshot's record).
    pub(super) partitions_at: Vec<u64>,
    /// Whose Relation message (new or repeated) was the last message, if one was.
    pub(super) described: Option<Described>,
}

impl<'a> Decoder<'a> {
    /// A decoder for `tables`, outside any transaction.
    pub(crate) fn new(
        pending: &'a PendingCommits,
        tables: Vec<StreamTable>,
        rules: &'a SyncRules,
    ) -> Self {
        Self {
            pgoutput: Pgoutput::default(),
            layouts: vec![None; tables.len()],
            pending,
            by_oid: tables
                .iter()
                .enumerate()
                .filter(|(_, t)| !t.gone)
                .map(|(i, t)| (t.oid, i))
                .collect(),
            by_name: tables
                .iter()
                .enumerate()
                .map(|(i, t)| (t.qualified(), i))
                .collect(),
            described_at: vec![0; tables.len()],
            partitions_at: vec![0; tables.len()],
            described: None,
            missing_since: std::collections::BTreeMap::new(),
            gone_after: GONE_AFTER,
            tables,
            rules,
            in_transaction: false,
            passed: 0,
            commit_lsn: 0,
        }
    }

    /// Decodes one message (the payload of an XLogData frame).
    pub(super) fn decode(&mut self, payload: Bytes) -> Result<Option<Change>, ReplicationError> {
        let message = self
            .read(payload)
            .map_err(|e| stream_error(e.to_string()))?;
        self.decode_message(message)
    }

    /// Reads one message (it may describe a relation).
    pub(crate) fn read(&mut self, payload: Bytes) -> Result<Message, source::PgoutputError> {
        self.pgoutput.read(payload)
    }

    /// The change a message read makes, if any.
    pub(crate) fn decode_message(
        &mut self,
        message: Message,
    ) -> Result<Option<Change>, ReplicationError> {
        // Type messages may come between a partitioned table's Relation message and its
        // partition's; any other message ends the pair.
        let before = match &message {
            Message::Other => self.described,
            _ => self.described.take(),
        };
        Ok(match message {
            Message::Begin {
                final_lsn,
                commit_micros,
            } => {
                self.in_transaction = true;
                self.commit_lsn = final_lsn;
                self.passed = self.passed.max(final_lsn);
                self.pending.received(final_lsn, commit_micros);
                Some(Change::Begin {
                    commit_lsn: final_lsn,
                })
            }
            Message::Commit { end_lsn } => {
                self.in_transaction = false;
                self.passed = self.passed.max(end_lsn);
                Some(Change::Commit {
                    end_lsn,
                    received: std::time::Instant::now(),
                })
            }
            Message::Relation(relation) => self.check_relation(&relation, before)?,
            Message::Redescribed { oid } => self.redescribed(oid, before)?,
            Message::Insert { relation, new } => {
                self.row_of(relation, [&new])?
                    .map(|(table, [new])| Change::Insert {
                        table,
                        new,
                        prepared: None,
                    })
            }
            Message::Update {
                relation,
                old: Some(old),
                new,
            } => self
                .row_of(relation, [&old, &new])?
                .map(|(table, [old, new])| Change::Update {
                    table,
                    old: Some(Box::new(old)),
                    new,
                    prepared: None,
                }),
            Message::Update {
                relation,
                old: None,
                new,
            } => self
                .row_of(relation, [&new])?
                .map(|(table, [new])| Change::Update {
                    table,
                    old: None,
                    new,
                    prepared: None,
                }),
            Message::Delete { relation, old } => self
                .row_of(relation, [&old])?
                .map(|(table, [old])| Change::Delete { table, old }),
            Message::Truncate { relations } => {
                let tables: Vec<usize> = relations
                    .iter()
                    .filter_map(|name| self.by_name.get(name).copied())
                    .collect();
                (!tables.is_empty()).then_some(Change::Truncate { tables })
            }
            Message::Logical {
                transactional: false,
                lsn,
                prefix,
                content,
            } if !self.in_transaction => {
                self.passed = self.passed.max(lsn);
                Some(if prefix == MESSAGE_PREFIX {
                    Change::Advance {
                        lsn,
                        write_checkpoint: WriteCheckpointNote::parse(&content, lsn),
                    }
                } else {
                    Change::Passed { lsn }
                })
            }
            Message::Unexpected(name) => {
                return Err(stream_error(format!(
                    "unexpected pgoutput message {name} (streaming and two-phase are off)"
                )))
            }
            Message::Logical { .. } | Message::Other => None,
        })
    }

    /// The covered table of relation `oid` and `tuples` with their values in that table's
    /// column order; `None` when the rules do not read the relation.
    fn row_of<const N: usize>(
        &mut self,
        oid: u32,
        tuples: [&Tuple; N],
    ) -> Result<Option<(usize, [Tuple; N])>, ReplicationError> {
        let Some(&index) = self.by_oid.get(&oid) else {
            return Ok(None);
        };
        let layout = match &self.layouts[index] {
            Some(layout) => layout,
            None => {
                let table = &self.tables[index];
                let relation = self.pgoutput.relation(oid).ok_or_else(|| {
                    stream_error(format!(
                        "a row of {} came before a Relation message described the table",
                        table.qualified()
                    ))
                })?;
                let layout = table
                    .columns
                    .iter()
                    .map(|c| relation.columns.iter().position(|r| r.name == c.name))
                    .collect();
                self.layouts[index].insert(layout)
            }
        };
        Ok(Some((index, tuples.map(|t| t.arranged(layout)))))
    }
}
