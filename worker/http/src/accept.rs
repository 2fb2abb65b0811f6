//! The quality a client gives a token in an `Accept` or `Accept-Encoding` list.

use hyper::header::HeaderValue;

/// `q` of `token` in a header like `a;q=0.9, b` (1.0 without `q=`); `None` when the
/// header is absent or does not list the token.
pub fn quality(header: Option<&HeaderValue>, token: &str) -> Option<f32> {
    let list = header.and_then(|v| v.to_str().ok())?;
    list.split(',').find_map(|part| {
        let mut pieces = part.split(';').map(str::trim);
        if !pieces.next()?.eq_ignore_ascii_case(token) {
            return None;
        }
        Some(
            pieces
                .find_map(|p| p.strip_prefix("q="))
                .and_then(|q| q.parse().ok())
                .unwrap_or(1.0),
        )
    })
}
