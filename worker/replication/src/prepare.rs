//! Rows made ready for the applier on the stream's task, as the snapshot's evaluators make
//! them for its writer: an insert or update whose new tuple is complete (no unchanged
//! TOAST value to fill in from the store) is evaluated and its outputs packed as soon as it
//! is decoded, while the applier writes the rows before it. The applier then only writes
//! it ([`store::WriteTxn::upsert_row_packed`]), so a bulk change's rule evaluation,
//! checksums and compression run beside the single writer instead of on it.
//!
//! A change this cannot prepare (an unchanged TOAST value, a value the rules reject, more
//! than 255 distinct outputs) goes on as decoded: the applier evaluates it as before and
//! reports any error in order. The decoder's copy of the tables follows the same Relation
//! changes as the applier's (`table::rebind`), so a row is evaluated with the binding the
//! applier would use for it.

use std::sync::Arc;

use smallvec::SmallVec;
use source::{Tuple, Value};
use store::{OutputPacker, Store};

use crate::change::Change;
use crate::row::{evaluate_row, PreparedRow};
use crate::store_input::StoreInput;
use crate::table::{table_at, StreamTable};

/// Prepares the rows of decoded changes (one per stream, on its task).
pub(super) struct Preparer {
    store: Arc<Store>,
    packer: OutputPacker,
}

impl Preparer {
    pub fn new(store: Arc<Store>) -> Self {
        let packer = store.output_packer();
        Self { store, packer }
    }

    /// Attaches the prepared new row to an insert or update of `tables` (as the decoder
    /// holds them at this change); other changes, and rows it cannot prepare, stay as
    /// they are.
    pub fn prepare(&mut self, tables: &[StreamTable], change: &mut Change) {
        let (table, new, prepared) = match change {
            Change::Insert {
                table,
                new,
                prepared,
            }
            | Change::Update {
                table,
                new,
                prepared,
                ..
            } => (*table, &*new, prepared),
            _ => return,
        };
        let Ok(table) = table_at(tables, table) else {
            return;
        };
        if self.packer.is_stale(&self.store) {
            self.packer = self.store.output_packer();
        }
        *prepared = self.prepare_row(table, new).map(Box::new);
    }

    fn prepare_row(&mut self, table: &StreamTable, new: &Tuple) -> Option<PreparedRow> {
        // The tuple's values as the applier would fill them (`values_of`); none to fill.
        let filled = (0..table.columns.len())
            .map(|i| match new.get(i) {
                Value::Bytes(bytes) => Some(Some(bytes)),
                Value::Null => Some(None),
                Value::Unchanged => None,
            })
            .collect::<Option<SmallVec<[Option<&[u8]>; 16]>>>()?;
        let row = evaluate_row(table, &filled, false).ok()?;
        let packed = self.packer.pack(&StoreInput::of(&row.eval).memberships)?;
        Some(PreparedRow { row, packed })
    }
}
