//! Numbers as JavaScript writes them (`Number.prototype.toString`): the official service
//! writes REAL values in row data, bucket names and lookup keys this way, so checksums
//! depend on these bytes. The digits come from `ryu-js`, which follows the ECMAScript
//! algorithm, ties included (the shortest digits closest to the value, the even one when
//! two are equally close).

/// Format a double the way JavaScript's `Number.prototype.toString` does
/// (`3.0` → `3`, `1e21` → `1e+21`, `1e-7` → `1e-7`). NaN and infinities print as JS does;
/// callers that write JSON must map them to `null` first.
pub fn js_number(f: f64) -> String {
    ryu_js::Buffer::new().format(f).to_owned()
}

/// Append [`js_number`]`(f)` to `out` without an intermediate `String`.
pub fn push_js_number(out: &mut String, f: f64) {
    out.push_str(ryu_js::Buffer::new().format(f));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn js_number_matches_javascript() {
        for (f, s) in [
            (3.0, "3"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (123.456, "123.456"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(js_number(f), s, "{f}");
        }
    }

    /// Values exactly halfway between two shortest candidates (written as exact sums and
    /// powers): JavaScript (node 20) takes the even last digit, where Rust's `{:e}` rounds
    /// up.
    #[test]
    fn ties_take_the_even_digit_as_javascript_does() {
        for (f, s) in [
            (1658206780088562.0 + 0.25, "1658206780088562.2"),
            (-1052730259603333.0 - 0.25, "-1052730259603333.2"),
            (0.5f64.powi(25), "2.9802322387695312e-8"),
        ] {
            assert_eq!(js_number(f), s, "{f:e}");
            let mut out = String::from("x");
            push_js_number(&mut out, f);
            assert_eq!(out, format!("x{s}"));
        }
    }

    #[test]
    fn non_finite_and_zero_print_as_javascript_does() {
        assert_eq!(js_number(f64::NAN), "NaN");
        assert_eq!(js_number(f64::INFINITY), "Infinity");
        assert_eq!(js_number(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(js_number(0.0), "0");
        assert_eq!(js_number(-0.0), "0");
    }
}
