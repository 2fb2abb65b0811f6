//! The request side of parameter lookups: answers the rules' [`LookupReader`] from the
//! `lookups` table at the read transaction's checkpoint, so a sync request sees exactly the
//! parameter rows committed with the checkpoint it is served.

use std::cell::RefCell;

use super::reader::ReadTxn;
use super::values::decode_values;
use super::StoreError;
use crate::rules::{LookupKey, LookupReader, OwnedValue, RulesError};

/// Bytes of the row id in front of each lookup dup value (see `writer::lookup_value`).
const ROW_ID_BYTES: usize = 8;

impl ReadTxn<'_, '_> {
    /// The output rows stored under `key`, one per source row, in row-id order.
    pub fn lookup_rows(&self, key: &LookupKey) -> Result<Vec<Vec<OwnedValue>>, StoreError> {
        let encoded = key.encode();
        let mdbx = |action| move |e| StoreError::mdbx(self.dir, action, e);
        let mut cursor = self
            .txn
            .cursor(&self.tables.lookups)
            .map_err(mdbx("open a cursor"))?;
        let mut rows = Vec::new();
        let mut next: Option<Vec<u8>> = cursor
            .set(encoded.as_bytes())
            .map_err(mdbx("seek a lookup"))?;
        while let Some(value) = next {
            let outputs = value
                .get(ROW_ID_BYTES..)
                .ok_or_else(|| StoreError::corrupt(self.dir, "lookup entry"))?;
            rows.push(decode_values(outputs).map_err(|c| StoreError::corrupt(self.dir, c.what))?);
            next = cursor
                .next_dup::<(), Vec<u8>>()
                .map_err(mdbx("read lookups"))?
                .map(|(_, v)| v);
        }
        Ok(rows)
    }
}

/// A [`LookupReader`] over one read transaction.
///
/// The rules' trait can only return a [`RulesError`]; a storage failure is kept here so the
/// caller reports it as what it is (a store problem, not a bad request): check
/// [`StoreLookups::take_failure`] after resolving.
pub struct StoreLookups<'v, 't, 'db> {
    view: &'v ReadTxn<'t, 'db>,
    failure: RefCell<Option<StoreError>>,
}

impl<'v, 't, 'db> StoreLookups<'v, 't, 'db> {
    /// Lookups read from `view`.
    pub fn new(view: &'v ReadTxn<'t, 'db>) -> Self {
        Self {
            view,
            failure: RefCell::new(None),
        }
    }

    /// The storage error a lookup met, if any.
    pub fn take_failure(&self) -> Option<StoreError> {
        self.failure.borrow_mut().take()
    }
}

impl LookupReader for StoreLookups<'_, '_, '_> {
    fn lookup(&self, key: &LookupKey) -> Result<Vec<Vec<OwnedValue>>, RulesError> {
        self.view.lookup_rows(key).map_err(|e| {
            let message = format!("reading parameter lookups failed: {e}");
            *self.failure.borrow_mut() = Some(e);
            RulesError::Request { message }
        })
    }
}
