//! The rules' parameter lookups answered from the store at one read transaction.

use std::cell::{Cell, RefCell};

use rules::{decode_lookup_outputs, LookupKey, LookupReader, OwnedValue, RulesError};
use store::{ReadTxn, StoreError};

/// A [`LookupReader`] over one read transaction.
///
/// The rules' trait can only return a [`RulesError`]; a storage failure is kept here so the
/// caller reports it as what it is (a store problem, not a bad request): check
/// [`StoreLookups::take_failure`] after resolving.
pub struct StoreLookups<'v, 't, 'db> {
    view: &'v ReadTxn<'t, 'db>,
    failure: RefCell<Option<StoreError>>,
    /// Rows all lookups of one request may return.
    max_results: usize,
    /// Rows returned so far.
    results: Cell<usize>,
}

impl<'v, 't, 'db> StoreLookups<'v, 't, 'db> {
    /// Lookups read from `view`, at most `max_results` rows in all.
    pub fn new(view: &'v ReadTxn<'t, 'db>, max_results: usize) -> Self {
        Self {
            view,
            failure: RefCell::new(None),
            max_results,
            results: Cell::new(0),
        }
    }

    /// The storage error a lookup met, if any.
    pub fn take_failure(&self) -> Option<StoreError> {
        self.failure.borrow_mut().take()
    }
}

impl LookupReader for StoreLookups<'_, '_, '_> {
    fn lookup(&self, key: &LookupKey) -> Result<Vec<Vec<OwnedValue>>, RulesError> {
        let fail = |e: StoreError| {
            let message = format!("reading parameter lookups failed: {e}");
            *self.failure.borrow_mut() = Some(e);
            RulesError::Request { message }
        };
        let rows = self
            .view
            .lookup_rows(key.encode().as_bytes())
            .map_err(fail)?;
        let results = self.results.get() + rows.len();
        self.results.set(results);
        if results > self.max_results {
            return Err(RulesError::Request {
                message: format!(
                    "the parameter queries return more than {} rows \
                     (api.parameters.max_parameter_query_results)",
                    self.max_results
                ),
            });
        }
        rows.iter()
            .map(|outputs| {
                decode_lookup_outputs(outputs)
                    .ok_or_else(|| fail(self.view.corrupt("lookup entry")))
            })
            .collect()
    }
}
