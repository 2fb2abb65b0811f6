//! Tuning of mimalloc, the allocator the extension installs for the worker (and the
//! worker's own test binaries use).
//!
//! mimalloc 3 returns freed memory to the system one second after it became free. The
//! snapshot frees memory at a high rate, so at any moment the worker held about 10–15 MiB
//! it no longer used (peak anonymous RSS 54–59 MiB at 1 M rows). With 100 ms the peak was
//! 42–44 MiB at the same worker CPU per row; with 0 it was 33–35 MiB but the constant
//! returning cost about 30 % more CPU (`docs/benchmark.md`).

use std::ffi::{c_int, c_long};

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (the pinned `libmimalloc-sys`
/// does not name it); a test checks it against the option's default.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// The worker's purge delay in milliseconds.
pub const PURGE_DELAY_MS: c_long = 100;

/// The operator's override (mimalloc reads it when the process starts).
const PURGE_DELAY_ENV: &str = "MIMALLOC_PURGE_DELAY";

extern "C" {
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`] unless `MIMALLOC_PURGE_DELAY` is set
/// in the environment. Call it once when the worker process starts; it only matters where
/// mimalloc is the global allocator.
pub fn shorten_purge_delay() {
    if std::env::var_os(PURGE_DELAY_ENV).is_none() {
        // SAFETY: mimalloc's options are plain integers it reads at each purge; setting one
        // is allowed at any time from any thread.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// mimalloc's purge delay now.
pub fn purge_delay() -> c_long {
    // SAFETY: reads an option value.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        if std::env::var_os(PURGE_DELAY_ENV).is_some() {
            return; // the environment decides; nothing to check here
        }
        // Only `purge_delay` defaults to 1000 in mimalloc 3: a wrong index fails here.
        assert_eq!(purge_delay(), 1000);
        shorten_purge_delay();
        assert_eq!(purge_delay(), PURGE_DELAY_MS);
    }
}
