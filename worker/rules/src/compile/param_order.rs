//! The order of a stream bucket's parameters at edition 3.
//!
//! The official compiler treats a bucket's parameters as a set and writes them in the
//! order of a stable hash of each one's row expression (its `StableHasher`, Jenkins' hash as
//! the Dart VM computes string hash codes), so that streams partitioning a table the same
//! way share buckets. A bucket name lists the values in that order, so it is reproduced
//! here: for a parameter on a row column the hash is of the SQL text `?` and the column's
//! name. Other row expressions keep the written order (their hash would need the official
//! compiler's SQL text of the expression).

use crate::expr::Expr;
use crate::plan::ParamFilter;

const SEED: u32 = 614_160_925;

/// The official `StableHasher`: strings fed by UTF-16 code unit.
struct StableHasher(u32);

impl StableHasher {
    fn add_hash(&mut self, value: u32) {
        let mut hash = 0x1fff_ffff & self.0.wrapping_add(value);
        hash = 0x1fff_ffff & hash.wrapping_add((0x0007_ffff & hash) << 10);
        self.0 = hash ^ (hash >> 6);
    }

    fn add_string(&mut self, s: &str) {
        for unit in s.encode_utf16() {
            self.add_hash(u32::from(unit));
        }
    }

    fn finish(&self) -> u32 {
        let mut hash = self.0;
        hash = 0x1fff_ffff & hash.wrapping_add((0x03ff_ffff & hash) << 3);
        hash ^= hash >> 11;
        0x1fff_ffff & hash.wrapping_add((0x0000_3fff & hash) << 15)
    }
}

/// The hash the official compiler orders a parameter on column `name` by.
fn column_key_hash(name: &str) -> u32 {
    let mut h = StableHasher(SEED);
    h.add_string("?");
    h.add_string(name);
    h.finish()
}

/// The written parameter indexes in the official order, when every parameter is a row
/// column (`slots` names them); `None` keeps the written order.
pub(crate) fn official_order(filters: &[ParamFilter], slots: &[String]) -> Option<Vec<usize>> {
    let mut keyed: Vec<(u32, usize)> = Vec::new();
    for f in filters {
        let ParamFilter::Param {
            param,
            row: Expr::Column(slot),
            expands: false,
        } = f
        else {
            return None;
        };
        keyed.push((column_key_hash(slots.get(*slot)?), *param));
    }
    // A stable sort: equal hashes keep the written order, as JavaScript's sort does.
    keyed.sort_by_key(|(hash, _)| *hash);
    Some(keyed.into_iter().map(|(_, param)| param).collect())
}

#[cfg(test)]
mod tests {
    use super::column_key_hash;

    /// Values computed by the official package (0.38.1) in Node.
    #[test]
    fn hashes_match_the_official_stable_hasher() {
        assert_eq!(column_key_hash("owner_id"), 104_385_299);
        assert_eq!(column_key_hash("project_id"), 448_190_296);
        assert_eq!(column_key_hash("user_id"), 533_226_539);
        assert_eq!(column_key_hash("id"), 430_693_012);
    }
}
