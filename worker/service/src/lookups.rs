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
    /// Rows read from the store so far: at most one past `max_results` (what the tests
    /// check).
    #[cfg(test)]
    read: Cell<usize>,
}

impl<'v, 't, 'db> StoreLookups<'v, 't, 'db> {
    /// Lookups read from `view`, at most `max_results` rows in all.
    pub fn new(view: &'v ReadTxn<'t, 'db>, max_results: usize) -> Self {
        Self {
            view,
            failure: RefCell::new(None),
            max_results,
            results: Cell::new(0),
            #[cfg(test)]
            read: Cell::new(0),
        }
    }

    /// Rows the lookups read from the store so far.
    #[cfg(test)]
    fn rows_read(&self) -> usize {
        self.read.get()
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
        // One row past what is left is enough to refuse the request: the rest of a key
        // with many rows is never read.
        let left = self.max_results.saturating_sub(self.results.get());
        let rows = self
            .view
            .lookup_rows_up_to(key.encode().as_bytes(), left.saturating_add(1))
            .map_err(fail)?;
        #[cfg(test)]
        self.read.set(self.read.get() + rows.len());
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

#[cfg(test)]
mod tests {
    use super::*;
    use rules::{encode_lookup_outputs, Value};
    use store::{LookupPut, Store};

    /// A key whose lookup has far more rows than a request may read is read only one row
    /// past the limit, and the request gets the limit's error.
    #[test]
    fn a_lookup_stops_reading_once_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let key = |value: &str| LookupKey {
            source: "by_list".into(),
            query: "0".into(),
            values: format!("[\"{value}\"]"),
        };
        let (many, few) = (key("many"), key("few"));
        let (many_key, few_key) = (many.encode(), few.encode());
        store
            .write(1, |w| {
                for i in 0..100_000u32 {
                    let outputs = encode_lookup_outputs(&[Value::Text(format!("l{i}").into())]);
                    let mut lookups = vec![LookupPut {
                        key: many_key.as_bytes(),
                        outputs: &outputs,
                    }];
                    if i < 6 {
                        lookups.push(LookupPut {
                            key: few_key.as_bytes(),
                            outputs: &outputs,
                        });
                    }
                    w.upsert_row(1, format!("r{i}").as_bytes(), &[], &lookups)?;
                }
                Ok(())
            })
            .unwrap();
        store
            .read(|view| {
                let over = |lookups: &StoreLookups<'_, '_, '_>| match lookups.lookup(&many) {
                    Err(RulesError::Request { message }) => message,
                    other => panic!("not the limit's error: {other:?}"),
                };
                let lookups = StoreLookups::new(view, 10);
                assert_eq!(
                    over(&lookups),
                    "the parameter queries return more than 10 rows \
                     (api.parameters.max_parameter_query_results)"
                );
                assert_eq!(lookups.rows_read(), 11);
                // Earlier lookups of the request leave less room.
                let lookups = StoreLookups::new(view, 10);
                assert_eq!(lookups.lookup(&few).unwrap().len(), 6);
                over(&lookups);
                assert_eq!(lookups.rows_read(), 11);
                // Within the limit, every row.
                let lookups = StoreLookups::new(view, 100_000);
                assert_eq!(lookups.lookup(&many).unwrap().len(), 100_000);
                assert!(lookups.take_failure().is_none());
                Ok(())
            })
            .unwrap();
    }
}
