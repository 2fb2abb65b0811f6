//! pgoutput messages (protocol version 1) read from the replication stream's raw payloads.
//!
//! The row messages (Insert, Update, Delete) are most of a stream and are read here: a
//! tuple keeps the message's bytes (one reference-counted buffer) and where each value
//! lies in it, so a row costs no allocation per column. Every other message goes through
//! `pg_walstream`'s parser. Its typed events cost a shared name and a buffer handle per
//! column, which was about a third of the worker's CPU for a bulk `UPDATE` (`perf`, 1m).
//!
//! A Relation message identical to the last one of its relation is reported as
//! [`Message::Redescribed`]: pgoutput sends one again after every invalidation of the
//! relation's cache, changed or not.

use std::collections::HashMap;

use bytes::Bytes;
use pg_walstream::{LogicalReplicationMessage, LogicalReplicationParser};
use smallvec::SmallVec;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// A pgoutput message the stream acts on.
#[derive(Debug)]
pub enum Message {
    /// A transaction starts; it commits at `final_lsn`.
    Begin {
        /// Where the transaction commits.
        final_lsn: u64,
        /// When it committed, in microseconds since the Unix epoch.
        commit_micros: i64,
    },
    /// The transaction ends; `end_lsn` is past its commit record.
    Commit {
        /// Past the commit record.
        end_lsn: u64,
    },
    /// A relation's shape, when it differs from the last one sent.
    Relation(Relation),
    /// A Relation message identical to the last one of its relation: which one it was
    /// (a partition's changes published under its root come after the root's and the
    /// partition's Relation messages, each new or not).
    Redescribed {
        /// The relation's OID.
        oid: u32,
    },
    /// A row inserted.
    Insert {
        /// The relation's OID.
        relation: u32,
        /// The new row.
        new: Tuple,
    },
    /// A row updated.
    Update {
        /// The relation's OID.
        relation: u32,
        /// The old key (`K`) or row (`O`), sent when the key changed or the relation's
        /// replica identity is FULL.
        old: Option<Tuple>,
        /// The new row; unchanged TOAST values are [`Value::Unchanged`].
        new: Tuple,
    },
    /// A row deleted.
    Delete {
        /// The relation's OID.
        relation: u32,
        /// The old key or row.
        old: Tuple,
    },
    /// Relations truncated, by their qualified names (`schema.name`) as their last
    /// Relation messages named them (a relation never described is left out).
    Truncate {
        /// `schema.name` of each relation truncated.
        relations: Vec<String>,
    },
    /// A logical message (`pg_logical_emit_message`).
    Logical {
        /// Emitted inside a transaction.
        transactional: bool,
        /// Its LSN.
        lsn: u64,
        /// Its prefix.
        prefix: String,
        /// Its content.
        content: Bytes,
    },
    /// A message of streamed or two-phase transactions (both are off): its name.
    Unexpected(&'static str),
    /// Anything else (Type, Origin).
    Other,
}

/// A relation as a Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Its OID.
    pub oid: u32,
    /// Its schema.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The replica identity setting (`d`, `n`, `f`, `i`).
    pub replica_identity: u8,
    /// Its columns, in the order tuples list them.
    pub columns: Vec<RelationColumn>,
}

/// A column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Its name.
    pub name: String,
    /// Its type's OID.
    pub type_oid: u32,
    /// Its type modifier.
    pub type_modifier: i32,
    /// Part of the replica identity.
    pub is_key: bool,
}

impl Relation {
    /// `schema.name`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }
}

/// A message pgoutput sent that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("a pgoutput message could not be read: {0}")]
pub struct PgoutputError(String);

/// Reads the messages of one replication session (it remembers the relations described).
pub struct Pgoutput {
    parser: LogicalReplicationParser,
    relations: HashMap<u32, Relation>,
}

impl Default for Pgoutput {
    fn default() -> Self {
        Self {
            parser: LogicalReplicationParser::with_protocol_version(1),
            relations: HashMap::new(),
        }
    }
}

impl Pgoutput {
    /// Reads one message (the payload of an XLogData frame).
    pub fn read(&mut self, payload: Bytes) -> Result<Message, PgoutputError> {
        match payload.first() {
            None => Ok(Message::Other),
            Some(b'I' | b'U' | b'D') => read_row(payload),
            Some(_) => self.read_other(payload),
        }
    }

    /// The relation `oid` as its last Relation message described it.
    pub fn relation(&self, oid: u32) -> Option<&Relation> {
        self.relations.get(&oid)
    }

    fn read_other(&mut self, payload: Bytes) -> Result<Message, PgoutputError> {
        let parsed = self
            .parser
            .parse_wal_message_bytes(payload)
            .map_err(|e| PgoutputError(e.to_string()))?;
        Ok(match parsed.message {
            LogicalReplicationMessage::Begin {
                final_lsn,
                timestamp,
                ..
            } => Message::Begin {
                final_lsn,
                commit_micros: timestamp.saturating_add(POSTGRES_EPOCH_MICROS),
            },
            LogicalReplicationMessage::Commit { end_lsn, .. } => Message::Commit { end_lsn },
            LogicalReplicationMessage::Relation {
                relation_id,
                namespace,
                relation_name,
                replica_identity,
                columns,
            } => {
                let relation = Relation {
                    oid: relation_id,
                    namespace: namespace.to_string(),
                    name: relation_name.to_string(),
                    replica_identity,
                    columns: columns
                        .iter()
                        .map(|c| RelationColumn {
                            name: c.name.to_string(),
                            type_oid: c.type_id,
                            type_modifier: c.type_modifier,
                            is_key: c.is_key(),
                        })
                        .collect(),
                };
                if self.relations.get(&relation_id) == Some(&relation) {
                    Message::Redescribed { oid: relation_id }
                } else {
                    self.relations.insert(relation_id, relation.clone());
                    Message::Relation(relation)
                }
            }
            LogicalReplicationMessage::Truncate { relation_ids, .. } => Message::Truncate {
                relations: relation_ids
                    .iter()
                    .filter_map(|oid| self.relations.get(oid).map(Relation::qualified))
                    .collect(),
            },
            LogicalReplicationMessage::Message {
                flags,
                lsn,
                prefix,
                content,
            } => Message::Logical {
                transactional: flags & 1 != 0,
                lsn,
                prefix,
                content,
            },
            LogicalReplicationMessage::StreamStart { .. } => Message::Unexpected("Stream Start"),
            LogicalReplicationMessage::StreamStop => Message::Unexpected("Stream Stop"),
            LogicalReplicationMessage::StreamCommit { .. } => Message::Unexpected("Stream Commit"),
            LogicalReplicationMessage::StreamAbort { .. } => Message::Unexpected("Stream Abort"),
            LogicalReplicationMessage::BeginPrepare { .. } => Message::Unexpected("Begin Prepare"),
            LogicalReplicationMessage::Prepare { .. } => Message::Unexpected("Prepare"),
            LogicalReplicationMessage::CommitPrepared { .. } => {
                Message::Unexpected("Commit Prepared")
            }
            LogicalReplicationMessage::RollbackPrepared { .. } => {
                Message::Unexpected("Rollback Prepared")
            }
            LogicalReplicationMessage::StreamPrepare { .. } => {
                Message::Unexpected("Stream Prepare")
            }
            _ => Message::Other,
        })
    }
}

/// Reads an Insert, Update or Delete message.
fn read_row(payload: Bytes) -> Result<Message, PgoutputError> {
    let mut r = Cursor {
        data: &payload,
        at: 0,
    };
    let kind = r.u8()?;
    let relation = r.u32()?;
    let message = match kind {
        b'I' => {
            r.expect(b'N')?;
            Message::Insert {
                relation,
                new: r.tuple(&payload)?,
            }
        }
        b'U' => {
            let old = match r.u8()? {
                b'K' | b'O' => {
                    let old = r.tuple(&payload)?;
                    r.expect(b'N')?;
                    Some(old)
                }
                b'N' => None,
                other => return Err(r.unexpected(other, "K, O or N")),
            };
            Message::Update {
                relation,
                old,
                new: r.tuple(&payload)?,
            }
        }
        _ => match r.u8()? {
            b'K' | b'O' => Message::Delete {
                relation,
                old: r.tuple(&payload)?,
            },
            other => return Err(r.unexpected(other, "K or O")),
        },
    };
    if r.at != payload.len() {
        return Err(PgoutputError(format!(
            "{} bytes after the end of a row message",
            payload.len() - r.at
        )));
    }
    Ok(message)
}

/// A position in a message being read.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PgoutputError> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.data.len());
        let Some(end) = end else {
            return Err(PgoutputError(format!(
                "a row message ends at byte {} of {} while reading {n} more",
                self.data.len(),
                self.at
            )));
        };
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, PgoutputError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, PgoutputError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn expect(&mut self, wanted: u8) -> Result<(), PgoutputError> {
        match self.u8()? {
            got if got == wanted => Ok(()),
            got => Err(self.unexpected(got, &char::from(wanted).to_string())),
        }
    }

    fn unexpected(&self, got: u8, wanted: &str) -> PgoutputError {
        PgoutputError(format!(
            "byte {:#04x} at offset {} of a row message where {wanted} belongs",
            got,
            self.at - 1
        ))
    }

    /// TupleData: Int16 column count, then per column `n` (null), `u` (unchanged TOAST
    /// value), or `t`/`b` with an Int32 length and the value.
    fn tuple(&mut self, payload: &Bytes) -> Result<Tuple, PgoutputError> {
        let count = {
            let b = self.take(2)?;
            u16::from_be_bytes([b[0], b[1]])
        };
        let mut cells = SmallVec::with_capacity(usize::from(count));
        for _ in 0..count {
            cells.push(match self.u8()? {
                b'n' => Cell::NULL,
                b'u' => Cell::UNCHANGED,
                b't' | b'b' => {
                    let len = self.u32()?;
                    if len >= Cell::UNCHANGED.len {
                        return Err(PgoutputError(format!("a value of {len} bytes")));
                    }
                    let start = self.at;
                    self.take(len as usize)?;
                    Cell {
                        start: start as u32,
                        len,
                    }
                }
                other => return Err(self.unexpected(other, "n, u, t or b")),
            });
        }
        Ok(Tuple {
            data: payload.clone(),
            cells,
        })
    }
}

/// A row's values in one buffer: where each value lies in the message it came in.
#[derive(Clone)]
pub struct Tuple {
    data: Bytes,
    cells: SmallVec<[Cell; 16]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    start: u32,
    /// The value's length, or one of the two markers below.
    len: u32,
}

impl Cell {
    const NULL: Cell = Cell {
        start: 0,
        len: u32::MAX,
    };
    const UNCHANGED: Cell = Cell {
        start: 0,
        len: u32::MAX - 1,
    };
}

/// A value of a [`Tuple`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// SQL NULL.
    Null,
    /// An unchanged TOAST value pgoutput did not send (or a column the tuple lacks).
    Unchanged,
    /// The value's text (or binary) form.
    Bytes(&'a [u8]),
}

impl Tuple {
    /// A tuple of `values` (for tests and tools; the stream reads tuples from messages).
    pub fn of(values: &[Value<'_>]) -> Self {
        let mut data = Vec::new();
        let cells = values
            .iter()
            .map(|v| match v {
                Value::Null => Cell::NULL,
                Value::Unchanged => Cell::UNCHANGED,
                Value::Bytes(b) => {
                    let start = data.len() as u32;
                    data.extend_from_slice(b);
                    Cell {
                        start,
                        len: b.len() as u32,
                    }
                }
            })
            .collect();
        Self {
            data: Bytes::from(data),
            cells,
        }
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Value `i` ([`Value::Unchanged`] past the end).
    pub fn get(&self, i: usize) -> Value<'_> {
        match self.cells.get(i) {
            None => Value::Unchanged,
            Some(&c) if c == Cell::NULL => Value::Null,
            Some(&c) if c == Cell::UNCHANGED => Value::Unchanged,
            Some(c) => Value::Bytes(&self.data[c.start as usize..(c.start + c.len) as usize]),
        }
    }

    /// Its values in order.
    pub fn values(&self) -> impl Iterator<Item = Value<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The same values rearranged: value `i` of the result is value `positions[i]` of this
    /// one (`None`: [`Value::Unchanged`]). Shares the buffer.
    pub fn arranged(&self, positions: &[Option<usize>]) -> Self {
        Self {
            data: self.data.clone(),
            cells: positions
                .iter()
                .map(|p| {
                    p.and_then(|p| self.cells.get(p).copied())
                        .unwrap_or(Cell::UNCHANGED)
                })
                .collect(),
        }
    }
}

impl std::fmt::Debug for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.values().map(|v| match v {
                Value::Bytes(b) => format!("{:?}", String::from_utf8_lossy(b)),
                other => format!("{other:?}"),
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests;
