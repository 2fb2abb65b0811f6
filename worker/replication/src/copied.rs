//! A table's copied rows on their way from a copy to the merge (a re-copy's or a rebuild's):
//! the `COPY` lines as read, evaluated with the rules, and the events a re-copy hands the
//! applier.

use bytes::Bytes;

use crate::error::ReplicationError;
use crate::row::EvaluatedRow;
use crate::table::{key_columns, StreamTable};
use crate::toast::stash_for;
use source::{ColumnMeta, CopyFields, Partition};
use store::{identity_key, StoredAs};

/// A copied row: one line of `COPY` text (without its newline), values in the copy's
/// column order.
pub(super) type CopiedRow = Bytes;

/// A copied row as the merge takes it, with how it compared with the store when that
/// was done beside the applier (after the store held every transaction committed before
/// the copy's consistent point): its verdict and the stored row's id.
pub(super) type CopiedEvaluation = (EvaluatedRow, Option<(StoredAs, Option<u64>)>);

/// Evaluates copied rows of `shape` (`COPY` text lines, values in its column order) with
/// the rules it was shaped by; with the key each may still be stored under when the
/// stored rows are keyed by `rekey_from`.
pub(super) fn evaluate_copied(
    shape: &StreamTable,
    rekey_from: &[String],
    rows: Vec<CopiedRow>,
) -> Result<Vec<EvaluatedRow>, ReplicationError> {
    let previous = key_columns(shape, rekey_from);
    let mut fields = CopyFields::new(shape.columns.len());
    rows.iter()
        .map(|line| {
            let values = fields.decode(line).map_err(|e| ReplicationError::Copy {
                table: shape.qualified(),
                problem: e.to_string(),
            })?;
            let value = |i: usize| values.get(i);
            let eval = shape.evaluate(|i| values.get_str(i))?;
            let identity = identity_key(shape.identity_columns().iter().map(|&i| value(i)));
            let previous = previous
                .as_ref()
                .map(|columns| identity_key(columns.iter().map(|&i| value(i))))
                .filter(|previous| *previous != identity);
            Ok(EvaluatedRow {
                identity,
                previous,
                eval,
                stash: stash_for(&shape.columns, value, false),
            })
        })
        .collect()
}

/// What a re-copy hands the stream, in this order.
#[derive(Debug)]
pub(super) enum RecopyEvent {
    /// The snapshot: consistent at `consistent_point`, the table with `columns` and
    /// `partitions` (`None`: not partitioned) there.
    Started {
        table: usize,
        consistent_point: u64,
        columns: Vec<ColumnMeta>,
        partitions: Option<Vec<Partition>>,
    },
    /// Copied rows, evaluated with the rules: those to merge (with how they compared
    /// with the store, when that was done), and the row ids of those found stored
    /// exactly so (nothing to write; see `compare`).
    Rows {
        table: usize,
        rows: Vec<CopiedEvaluation>,
        unchanged: Vec<u64>,
    },
    /// Every row was handed over.
    Done { table: usize },
}

impl RecopyEvent {
    pub(super) fn table(&self) -> usize {
        match self {
            Self::Started { table, .. } | Self::Rows { table, .. } | Self::Done { table } => *table,
        }
    }
}
