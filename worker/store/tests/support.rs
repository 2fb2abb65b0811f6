//! Helpers the store's tests share.

use store::RowPut;

/// A `notes` row of `bucket`, its checksum the data's length.
pub fn put<'a>(bucket: &'a str, id: &'a str, data: &'a str) -> RowPut<'a> {
    RowPut {
        bucket,
        object_type: "notes",
        object_id: id,
        data,
        checksum: data.len() as u32,
    }
}
