//! A row's values as the applier fills and evaluates them: a decoded tuple's columns
//! ([`Presence`]), the unchanged TOAST values filled in, the identity it is keyed by, and
//! the complete row evaluated with the rules ([`EvaluatedRow`]).

use std::borrow::Cow;

use crate::error::ReplicationError;
use crate::table::StreamTable;
use crate::toast::stash_for;
use rules::{RowEvaluation, RulesError};
use smallvec::SmallVec;
use source::{Tuple, Value};
use store::{identity_key, PackedOutputs, Stash};

/// The key an update addresses: from the old tuple when the key changed (or the table is
/// REPLICA IDENTITY FULL), else from the new one, which must then carry every key column.
pub(super) fn old_identity_of(
    table: &StreamTable,
    old_values: Option<&[Presence]>,
    values: &[Presence],
) -> Result<Vec<u8>, ReplicationError> {
    let new_identity_known = table
        .identity_columns()
        .iter()
        .all(|&i| values.get(i).is_some_and(Presence::is_known));
    match old_values {
        Some(old) => Ok(identity_of(table, old)),
        None if new_identity_known => Ok(identity_of(table, values)),
        None => Err(toast_error(table, "a replica identity column")),
    }
}

/// Replaces the update's unchanged TOAST values: from the FULL old tuple, else from the
/// values kept with the stored row (`stored`, read only when needed). Returns whether a
/// kept value was used.
pub(super) fn fill_unchanged<'t>(
    table: &StreamTable,
    old_values: Option<&[Presence<'t>]>,
    values: &mut [Presence<'t>],
    stored: impl FnOnce() -> Result<Stash, ReplicationError>,
) -> Result<bool, ReplicationError> {
    if !values.iter().any(|v| matches!(v, Presence::Unchanged)) {
        return Ok(false);
    }
    let stash = stored()?;
    let mut used_stash = false;
    for (i, (value, column)) in values.iter_mut().zip(&table.columns).enumerate() {
        if !matches!(value, Presence::Unchanged) {
            continue;
        }
        let from_old = old_values
            .and_then(|o| o.get(i))
            .filter(|v| v.is_known())
            .cloned();
        *value = match from_old {
            Some(v) => v,
            None => {
                let kept = stash
                    .iter()
                    .find(|(name, _)| name == &column.name)
                    .map(|(_, v)| Presence::Value(Cow::Owned(v.clone())));
                match kept {
                    Some(value) => {
                        used_stash = true;
                        value
                    }
                    // Not kept (renamed since, say): the rules do not read it, so its
                    // value cannot change what they produce.
                    None if !table.reads_at(i).unwrap_or(true) => Presence::Null,
                    None => return Err(toast_error(table, &column.name)),
                }
            }
        };
    }
    Ok(used_stash)
}

/// A complete row as the store takes it.
#[derive(Debug)]
pub(super) struct EvaluatedRow {
    pub identity: Vec<u8>,
    /// A re-copy after the replica identity changed: the key the row may be stored under.
    pub previous: Option<Vec<u8>>,
    pub eval: RowEvaluation,
    pub stash: Stash,
}

/// Evaluates a complete row (values in the table's column order) with the rules the
/// table was shaped by: its identity, bucket memberships and lookups, and the values kept
/// for later TOAST updates.
pub(super) fn evaluate_row(
    table: &StreamTable,
    values: &[Option<&[u8]>],
    used_stash: bool,
) -> Result<EvaluatedRow, ReplicationError> {
    let texts = values
        .iter()
        .zip(&table.columns)
        .map(|(v, c)| {
            // simdutf8 checks mostly-ASCII text several times faster than `std`.
            v.map(simdutf8::basic::from_utf8)
                .transpose()
                .map_err(|_| RulesError::Row {
                    table: table.qualified(),
                    column: c.name.clone(),
                    message: "value is not valid UTF-8".into(),
                })
        })
        .collect::<Result<SmallVec<[Option<&str>; 16]>, RulesError>>()?;
    let eval = table.evaluate(|i| texts.get(i).copied().flatten())?;
    let value = |i: usize| values.get(i).copied().flatten();
    Ok(EvaluatedRow {
        identity: identity_key(table.identity_columns().iter().map(|&i| value(i))),
        previous: None,
        eval,
        stash: stash_for(&table.columns, value, used_stash),
    })
}

/// One column of a decoded tuple.
#[derive(Debug, Clone)]
pub(super) enum Presence<'t> {
    Null,
    Value(Cow<'t, [u8]>),
    /// pgoutput's "unchanged TOAST value" (the column is absent from the tuple).
    Unchanged,
}

impl Presence<'_> {
    pub(super) fn is_known(&self) -> bool {
        !matches!(self, Self::Unchanged)
    }

    pub(super) fn as_deref(&self) -> Option<&[u8]> {
        match self {
            Self::Value(b) => Some(b),
            Self::Null | Self::Unchanged => None,
        }
    }
}

/// A tuple's values (already in the table's column order, see the stream's decoder).
pub(super) fn values_of<'t>(table: &StreamTable, tuple: &'t Tuple) -> Vec<Presence<'t>> {
    (0..table.columns.len())
        .map(|i| match tuple.get(i) {
            Value::Null => Presence::Null,
            Value::Unchanged => Presence::Unchanged,
            Value::Bytes(b) => Presence::Value(Cow::Borrowed(b)),
        })
        .collect()
}

pub(super) fn identity_of(table: &StreamTable, values: &[Presence]) -> Vec<u8> {
    identity_key(
        table
            .identity_columns()
            .iter()
            .map(|&i| values.get(i).and_then(Presence::as_deref)),
    )
}

/// A row change's new row, evaluated and packed.
#[derive(Debug)]
pub(super) struct PreparedRow {
    pub row: EvaluatedRow,
    pub packed: PackedOutputs,
}

fn toast_error(table: &StreamTable, column: &str) -> ReplicationError {
    ReplicationError::Stream {
        code: "PSM_R2003",
        message: format!(
            "an update of {} left column \"{column}\" out as an unchanged TOAST value, and the \
             store does not hold it; nothing was applied. Set ALTER TABLE {} REPLICA IDENTITY FULL \
             and run SELECT powersync_mdbx.reset(), and please report this",
            table.qualified(),
            table.qualified()
        ),
        operator: true,
    }
}
