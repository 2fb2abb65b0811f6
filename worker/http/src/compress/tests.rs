//! The response coding's tests: negotiation, whole frames and members, what a
//! compressor and a thread's contexts hold; sizes on a realistic stream in `realistic`.

use super::zstd_frames::ZSTD_WINDOW_LOG;
use super::*;
use std::io::Read;

mod realistic;

#[test]
fn negotiation_prefers_zstd_and_respects_q_zero() {
    let v = |s: &'static str| HeaderValue::from_static(s);
    assert_eq!(Coding::negotiate(Some(&v("gzip, zstd"))), Coding::Zstd);
    assert_eq!(
        Coding::negotiate(Some(&v("gzip, deflate, br"))),
        Coding::Gzip
    );
    assert_eq!(Coding::negotiate(Some(&v("zstd;q=0, gzip"))), Coding::Gzip);
    assert_eq!(Coding::negotiate(Some(&v("identity"))), Coding::Identity);
    assert_eq!(Coding::negotiate(None), Coding::Identity);
}

/// Heap bytes in use (the C allocator's counters, every arena: zstd allocates there).
fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let info = unsafe { libc::mallinfo2() };
    info.uordblks + info.hblkhd
}

/// Whether this is the run that measures: the heap counters are the process's, and
/// the other tests of this binary allocate meanwhile, so a test that reads them runs
/// again in a process of its own (the same binary, only `test` in it) and passes
/// if that run passes. True in that process; false in the one that started it, after
/// the run passed.
fn measuring_alone(test: &str) -> bool {
    const ALONE: &str = "PSM_TEST_MEASURING_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let run = std::process::Command::new(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ALONE, "1")
        .output()
        .unwrap_or_else(|e| panic!("running {} for {test}: {e}", exe.display()));
    let (out, err) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    eprint!("{err}");
    assert!(
        run.status.success() && out.contains("1 passed"),
        "{test} in a process of its own failed ({}):\n{out}{err}",
        run.status
    );
    false
}

/// A chunk of `lines` JSON lines, their size varying with `i`.
fn lines(i: usize, lines: usize) -> Vec<u8> {
    let line = format!(
        "{{\"op_id\":\"{i}\",\"object_id\":\"{:x}\",\"data\":\"{}\"}}\n",
        i * 7919,
        "lorem ipsum ".repeat(i % 50)
    );
    line.repeat(lines).into_bytes()
}

/// An idle compressor, whatever it compressed, holds no memory besides itself (the
/// few bytes measured, which a stream holds inline): 10,000 streams hold
/// 10,000 of them (`docs/operations.md` 4.5). The contexts belong to the threads.
#[test]
fn an_idle_compressor_holds_no_memory() {
    const COMPRESSORS: usize = 1_000;
    const BOUND: usize = 1024;
    if !measuring_alone("compress::tests::an_idle_compressor_holds_no_memory") {
        return;
    }
    for coding in [Coding::Zstd, Coding::Gzip] {
        // This thread's context, made once.
        drop(coding.compressor().chunk(lines(1, 100)).unwrap());
        let each = {
            let before = heap_in_use();
            let mut held = Vec::with_capacity(COMPRESSORS);
            for _ in 0..COMPRESSORS {
                let mut compressor = coding.compressor();
                for i in 0..20 {
                    drop(compressor.chunk(lines(i, 1 + i % 7 * 30)).unwrap());
                }
                held.push(compressor);
            }
            let each = heap_in_use().saturating_sub(before) / COMPRESSORS;
            drop(held);
            each
        };
        eprintln!("{coding:?}: {each} bytes of heap per idle compressor");
        assert!(
            each <= BOUND,
            "{coding:?}: {each} bytes per idle compressor, over {BOUND}"
        );
    }
}

/// The window a zstd frame asks its decoder for (RFC 8878 3.1.1.1).
fn zstd_window(frame: &[u8]) -> u64 {
    assert_eq!(frame[..4], [0x28, 0xb5, 0x2f, 0xfd], "a zstd frame");
    let descriptor = frame[4];
    if descriptor & 0x20 == 0 {
        let window = frame[5];
        let base = 1u64 << (10 + (window >> 3));
        return base + base / 8 * u64::from(window & 7);
    }
    // Single segment: the window is the content size.
    let at = 5 + [0, 1, 2, 4][usize::from(descriptor & 3)];
    let field = |n: usize| {
        let mut bytes = [0u8; 8];
        bytes[..n].copy_from_slice(&frame[at..at + n]);
        u64::from_le_bytes(bytes)
    };
    match descriptor >> 6 {
        0 => field(1),
        1 => field(2) + 256,
        2 => field(4),
        _ => field(8),
    }
}

/// Every zstd chunk is one whole frame (a decoder needs nothing before or after it),
/// and asks for at most the 16 KiB window, far below the 8 MB a `Content-Encoding:
/// zstd` decoder may cap it at (RFC 9659).
#[test]
fn every_zstd_chunk_is_a_whole_frame_with_a_small_window() {
    let mut compressor = Coding::Zstd.compressor();
    for (i, count) in [1, 3, 40, 200, 600, 1].into_iter().enumerate() {
        let chunk = lines(i * 11, count);
        let frame = compressor.chunk(chunk.clone()).unwrap();
        assert_eq!(
            zstd::zstd_safe::find_frame_compressed_size(&frame),
            Ok(frame.len()),
            "a {} byte chunk",
            chunk.len()
        );
        let window = zstd_window(&frame);
        assert!(window <= 1 << ZSTD_WINDOW_LOG, "{window} bytes");
        assert!(window <= 8 << 20);
        assert_eq!(zstd::decode_all(frame.as_slice()).unwrap(), chunk);
    }
}

/// A whole response, chunks then [`Compressor::finish`], decodes completely: one
/// gzip member with its trailer (length and CRC-32 checked), zstd frames back to back.
/// A response that sent nothing is an empty member.
#[test]
fn a_finished_response_decodes_whole() {
    for coding in [Coding::Zstd, Coding::Gzip] {
        for chunks in [0, 1, 12] {
            let mut compressor = coding.compressor();
            let (mut body, mut plain) = (Vec::new(), Vec::new());
            for i in 0..chunks {
                let chunk = lines(i * 5, 1 + i * 50);
                plain.extend_from_slice(&chunk);
                body.extend(compressor.chunk(chunk).unwrap());
            }
            body.extend(compressor.finish());
            let mut decoded = Vec::new();
            match coding {
                Coding::Zstd => {
                    zstd::stream::read::Decoder::new(body.as_slice())
                        .unwrap()
                        .read_to_end(&mut decoded)
                        .unwrap();
                }
                _ => {
                    let mut member = flate2::read::GzDecoder::new(body.as_slice());
                    member.read_to_end(&mut decoded).unwrap();
                    // Nothing after the one member.
                    let mut rest = Vec::new();
                    member.into_inner().read_to_end(&mut rest).unwrap();
                    assert!(rest.is_empty(), "{} bytes after the member", rest.len());
                }
            };
            assert!(decoded == plain, "{coding:?}, {chunks} chunks");
        }
    }
}

/// What a thread's contexts hold, made at its first chunk (`docs/operations.md` 4.5):
/// they are per thread (the runtime's and the readers'), not per stream.
#[test]
fn a_threads_contexts_hold_a_bounded_amount_of_memory() {
    if !measuring_alone("compress::tests::a_threads_contexts_hold_a_bounded_amount_of_memory") {
        return;
    }
    for (coding, bound_kib) in [(Coding::Zstd, 256), (Coding::Gzip, 384)] {
        // Measured on a fresh thread (its contexts are made at its first chunk).
        let held = std::thread::spawn(move || {
            let chunk = lines(7, 2_000);
            let before = heap_in_use();
            let compressed = coding.compressor().chunk(chunk.clone()).unwrap();
            heap_in_use().saturating_sub(before + compressed.capacity()) / 1024
        })
        .join()
        .unwrap();
        eprintln!("{coding:?}: {held} KiB of contexts per thread");
        assert!(
            held <= bound_kib,
            "{coding:?}: {held} KiB, over {bound_kib}"
        );
    }
}

/// A finished zstd or gzip `body`, decoded.
fn whole_body(coding: Coding, body: &[u8]) -> Vec<u8> {
    let mut decoded = Vec::new();
    if coding == Coding::Zstd {
        zstd::stream::read::Decoder::new(body)
            .and_then(|mut d| d.read_to_end(&mut decoded))
            .unwrap();
    } else {
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut decoded)
            .unwrap();
    }
    decoded
}

/// A chunk the thread remembers is the same chunk in every stream that sends it: each
/// stream's body still decodes to exactly its own lines.
#[test]
fn a_remembered_chunk_decodes_in_every_stream_that_sends_it() {
    let shared = lines(3, 4);
    let own = lines(9, 2);
    for coding in [Coding::Zstd, Coding::Gzip] {
        let (mut a, mut b) = (coding.compressor(), coding.compressor());
        let mut a_sent = a.chunk(shared.clone()).unwrap();
        let b_first = b.chunk(shared.clone()).unwrap();
        assert_eq!(
            a_sent, b_first,
            "{coding:?}: the same first chunk, the same bytes"
        );
        let mut b_sent = b_first;
        b_sent.extend(b.chunk(own.clone()).unwrap());
        b_sent.extend(b.chunk(shared.clone()).unwrap());
        a_sent.extend(a.chunk(shared.clone()).unwrap());
        a_sent.extend(a.finish());
        b_sent.extend(b.finish());
        for (sent, want) in [
            (a_sent, [&shared[..], &shared[..]].concat()),
            (b_sent, [&shared[..], &own[..], &shared[..]].concat()),
        ] {
            assert_eq!(whole_body(coding, &sent), want, "{coding:?}");
        }
    }
}

#[test]
fn every_flushed_chunk_decodes_on_its_own_prefix() {
    for coding in [Coding::Zstd, Coding::Gzip] {
        let mut compressor = coding.compressor();
        let mut sent = Vec::new();
        let mut lines = String::new();
        for i in 0..50 {
            let line = format!("{{\"token_expires_in\":{i}}}\n");
            lines.push_str(&line);
            sent.extend(compressor.chunk(line.into_bytes()).unwrap());
            // What was sent so far decodes to every line so far.
            let mut decoded = Vec::new();
            match coding {
                Coding::Zstd => {
                    let mut d = zstd::stream::read::Decoder::new(sent.as_slice()).unwrap();
                    let _ = d.read_to_end(&mut decoded);
                }
                _ => {
                    let mut d = flate2::read::GzDecoder::new(sent.as_slice());
                    let _ = d.read_to_end(&mut decoded);
                }
            }
            assert_eq!(String::from_utf8(decoded).unwrap(), lines, "{coding:?}");
        }
    }
}
