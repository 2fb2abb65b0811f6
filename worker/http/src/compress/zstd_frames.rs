//! zstd frames: each chunk one whole frame, compressed with this thread's context.

use std::cell::RefCell;
use std::io;

use super::remembered::{fitted, remembered, Remembered};

/// zstd level: the fastest, most of the gain on JSON lines.
pub(super) const ZSTD_LEVEL: i32 = 1;
/// zstd window (16 KiB) and match tables, chosen for memory: a frame asks its decoder for
/// at most a 16 KiB window (the chunk's size when smaller; a `Content-Encoding: zstd`
/// decoder may refuse more than 8 MB), a thread's context holds about 120 KiB (level 3's
/// defaults: a 2 MiB window, several MiB), and JSON lines compress as well.
pub(super) const ZSTD_WINDOW_LOG: u32 = 14;
pub(super) const ZSTD_HASH_LOG: u32 = 13;
pub(super) const ZSTD_CHAIN_LOG: u32 = 12;

/// An empty zstd frame (single segment, content size 0, one empty last raw block): the
/// body of a response that sent no frame.
pub(super) const ZSTD_EMPTY_FRAME: [u8; 9] = [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0, 1, 0, 0];

thread_local! {
    /// This thread's last small zstd frame.
    static LAST_ZSTD: RefCell<Remembered> = RefCell::default();
    /// This thread's zstd context, made at its first frame.
    static ZSTD: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
}

/// `data` as one whole zstd frame, compressed with this thread's context.
pub(super) fn zstd_frame(data: &[u8]) -> io::Result<Vec<u8>> {
    remembered(&LAST_ZSTD, data, |data| {
        let mut out = Vec::with_capacity(zstd::zstd_safe::compress_bound(data.len()));
        ZSTD.with(|context| {
            let mut slot = context.borrow_mut();
            let context = match &mut *slot {
                Some(context) => context,
                empty => empty.insert(zstd_context()?),
            };
            context.compress_to_buffer(data, &mut out)
        })?;
        Ok(fitted(out))
    })
}

/// A zstd context with the response parameters. Its parameters stay across frames.
fn zstd_context() -> io::Result<zstd::bulk::Compressor<'static>> {
    use zstd::zstd_safe::CParameter;
    let mut context = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    context.set_parameter(CParameter::WindowLog(ZSTD_WINDOW_LOG))?;
    context.set_parameter(CParameter::HashLog(ZSTD_HASH_LOG))?;
    context.set_parameter(CParameter::ChainLog(ZSTD_CHAIN_LOG))?;
    Ok(context)
}
