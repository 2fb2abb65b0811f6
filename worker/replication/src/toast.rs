//! Which source values a row keeps for later updates that leave a TOASTed value out.
//!
//! pgoutput sends an UPDATE's unchanged out-of-line (TOASTed) values as "unchanged"
//! with no data (unless the table has REPLICA IDENTITY FULL, whose old tuple carries
//! them). Re-evaluating the row then needs the stored value. PostgreSQL moves values out
//! of line only when the whole heap tuple exceeds `TOAST_TUPLE_THRESHOLD` (about 2 KB
//! with 8 KB pages), so the store keeps the variable-length values of a row only when a
//! conservative estimate of its heap size could exceed that. Ordinary rows keep nothing,
//! which is what keeps the store smaller than the source.

use source::ColumnMeta;
use store::Stash;

/// Below every threshold PostgreSQL uses for its supported block sizes (4 KB pages:
/// about 1 KB), so the estimate errs on the side of keeping values.
const TOAST_THRESHOLD_BYTES: usize = 900;
/// Heap tuple header and null bitmap, generously.
const TUPLE_OVERHEAD: usize = 64;
/// Alignment padding and varlena header per column, generously.
const COLUMN_OVERHEAD: usize = 8;

/// Text-form types whose binary size is at most their text size (plus a header).
const TEXT_LIKE: &[u32] = &[
    25,   // text
    1043, // varchar
    1042, // bpchar
    17,   // bytea (text form is hex: twice the binary size)
    114,  // json
    142,  // xml
    18,   // "char"
];

/// An upper bound of the binary size of one value from its text form.
fn binary_bound(column: &ColumnMeta, text: &[u8]) -> usize {
    if column.typlen > 0 {
        return usize::try_from(column.typlen).unwrap_or(0) + COLUMN_OVERHEAD;
    }
    // jsonb, arrays, numeric and other types can be several times larger in binary
    // than in text (`[1,1,1]`: 2 text bytes per element, 8–12 binary ones).
    let factor = if TEXT_LIKE.contains(&column.type_oid) {
        1
    } else {
        8
    };
    text.len().saturating_mul(factor) + COLUMN_OVERHEAD
}

/// True when PostgreSQL may have stored some value of this row out of line.
pub(super) fn may_be_toasted<'a>(
    columns: &[ColumnMeta],
    values: impl Fn(usize) -> Option<&'a [u8]>,
) -> bool {
    let mut size = TUPLE_OVERHEAD;
    for (i, column) in columns.iter().enumerate() {
        if let Some(text) = values(i) {
            size = size.saturating_add(binary_bound(column, text));
            if size > TOAST_THRESHOLD_BYTES {
                return true;
            }
        }
    }
    false
}

/// The values to keep with a row: its variable-length, non-null values when the row may
/// be TOASTed (or `force`: it just used a kept value, which is still out of line).
pub(super) fn stash_for<'a>(
    columns: &[ColumnMeta],
    values: impl Fn(usize) -> Option<&'a [u8]> + Copy,
    force: bool,
) -> Stash {
    if !force && !may_be_toasted(columns, values) {
        return Stash::new();
    }
    columns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.typlen < 0)
        .filter_map(|(i, c)| values(i).map(|v| (c.name.clone(), v.to_vec())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, type_oid: u32, typlen: i16) -> ColumnMeta {
        ColumnMeta {
            name: name.into(),
            type_oid,
            element_oid: None,
            typlen,
            attnum: 0,
        }
    }

    #[test]
    fn small_rows_keep_nothing_and_large_rows_keep_their_varlena_values() {
        let columns = [column("id", 23, 4), column("body", 25, -1)];
        let small = [Some(b"1".as_slice()), Some(b"short".as_slice())];
        assert!(stash_for(&columns, |i| small[i], false).is_empty());
        let long = vec![b'x'; 2000];
        let large = [Some(b"1".as_slice()), Some(long.as_slice())];
        let stash = stash_for(&columns, |i| large[i], false);
        assert_eq!(stash, vec![("body".to_string(), long.clone())]);
        // A row that used a kept value keeps its values even when it looks small.
        assert_eq!(stash_for(&columns, |i| small[i], true).len(), 1);
    }

    #[test]
    fn jsonb_and_arrays_count_at_their_possible_binary_size() {
        let columns = [column("doc", 3802, -1)];
        let text = vec![b'1'; 150];
        assert!(may_be_toasted(&columns, |_| Some(text.as_slice())));
        let columns = [column("doc", 25, -1)];
        assert!(!may_be_toasted(&columns, |_| Some(text.as_slice())));
    }
}
