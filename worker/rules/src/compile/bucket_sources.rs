//! Which bucket each stream query writes to (edition 3), as the official compiler decides:
//! a stream's queries whose buckets are instantiated the same way for every request (the
//! same request filters, lookups and parameter values) share one bucket (`s|0` for both of
//! `SELECT * FROM a` and `SELECT * FROM b`), and streams whose queries make the same rows of
//! the same tables into buckets the same way share that bucket too, named after the first
//! (the fixture's `tasks` and `tasks_dashboard` both sync `tasks|0[]`). Earlier editions
//! keep one bucket per stream query.

use std::collections::HashMap;

use crate::bucket::BucketVersion;
use crate::fingerprint::Fingerprint;
use crate::plan::{DataEvaluator, TableRef};
use crate::request::{BucketResolver, LookupGroup};

/// A stream query's bucket before it has a name: `stream|n`, how a request finds its
/// instances, and the data queries that fill it.
pub(crate) struct StreamBucket {
    pub name: String,
    /// The stream query it came from (`query`, `queries[k]`), for warnings.
    pub query_label: String,
    pub resolver: BucketResolver,
    pub evaluators: Vec<(TableRef, DataEvaluator)>,
}

/// A stream's buckets with those instantiated alike merged into the first of them.
pub(crate) fn merge_within_stream(buckets: Vec<StreamBucket>) -> Vec<StreamBucket> {
    let mut merged: Vec<(String, StreamBucket)> = Vec::new();
    for b in buckets {
        let key = instantiation(&b.resolver);
        match merged.iter_mut().find(|(k, _)| *k == key) {
            Some((_, first)) => {
                for e in b.evaluators {
                    if !first
                        .evaluators
                        .iter()
                        .any(|x| behaviour(x) == behaviour(&e))
                    {
                        first.evaluators.push(e);
                    }
                }
            }
            None => merged.push((key, b)),
        }
    }
    merged.into_iter().map(|(_, b)| b).collect()
}

/// The names given so far, by what fills the bucket.
#[derive(Default)]
pub(crate) struct Names {
    by_evaluators: HashMap<String, String>,
}

impl Names {
    /// Names `b` (with its stream's `fingerprint`, in its tag) or gives it the name of an
    /// earlier bucket filled the same way (`share`, edition 3). Returns the resolver and the
    /// data queries to evaluate: none when the bucket was named before.
    pub(crate) fn assign(
        &mut self,
        b: StreamBucket,
        share: bool,
        version: BucketVersion,
        fingerprint: &Fingerprint,
    ) -> (BucketResolver, Vec<(TableRef, DataEvaluator)>) {
        let StreamBucket {
            name,
            mut resolver,
            mut evaluators,
            ..
        } = b;
        if share {
            let mut keys: Vec<String> = evaluators.iter().map(behaviour).collect();
            keys.sort();
            let key = keys.join("\n");
            if let Some(prefix) = self.by_evaluators.get(&key) {
                resolver.prefix = prefix.clone();
                return (resolver, Vec::new());
            }
            let prefix = version.prefix(&name, fingerprint);
            self.by_evaluators.insert(key, prefix);
        }
        let prefix = version.prefix(&name, fingerprint);
        for (_, e) in &mut evaluators {
            e.prefix = prefix.clone();
        }
        resolver.prefix = prefix;
        (resolver, evaluators)
    }
}

/// What a data query makes of rows, as text (its bucket name not yet given).
fn behaviour((table, e): &(TableRef, DataEvaluator)) -> String {
    format!("{table:?} {e:?}")
}

/// How a resolver instantiates buckets, as text: its request filters (in any order), its
/// lookups (whatever their storage names) and its parameters.
fn instantiation(r: &BucketResolver) -> String {
    let mut filters: Vec<String> = r.request_filters.iter().map(|f| format!("{f:?}")).collect();
    filters.sort();
    let groups: Vec<LookupGroup> = r.groups.iter().cloned().map(LookupGroup::unnamed).collect();
    format!(
        "{filters:?} {groups:?} {:?} {:?} {}",
        r.params, r.priority, r.null_makes_no_bucket
    )
}
