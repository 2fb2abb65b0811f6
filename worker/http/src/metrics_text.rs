//! The Prometheus text exposition format, version 0.0.4: `# HELP` and `# TYPE` per
//! family, then one line per sample; label values and help text escaped as the format
//! requires.

use std::fmt::Write;

use metrics::HistogramSnapshot;

/// The content type of the format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets when the engine restarts).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Cumulative buckets, `_sum` and `_count`.
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// Builds one exposition.
#[derive(Default)]
pub struct TextEncoder {
    out: String,
}

impl TextEncoder {
    /// Starts a family: its HELP and TYPE lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(
            self.out,
            "# HELP {name} {}\n# TYPE {name} {}",
            escape_help(help),
            kind.as_str()
        );
    }

    /// One sample line.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        self.labels(labels);
        self.out.push(' ');
        self.out.push_str(&format_value(value));
        self.out.push('\n');
    }

    /// One sample line with an integer value (exact beyond 2^53).
    pub fn sample_u64(&mut self, name: &str, labels: &[(&str, &str)], value: u64) {
        self.out.push_str(name);
        self.labels(labels);
        let _ = writeln!(self.out, " {value}");
    }

    /// A family with one unlabelled integer sample.
    pub fn single_u64(&mut self, name: &str, kind: Kind, help: &str, value: u64) {
        self.family(name, kind, help);
        self.sample_u64(name, &[], value);
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A histogram family: cumulative `_bucket` lines ending with `+Inf`, `_sum`, `_count`.
    pub fn histogram(&mut self, name: &str, help: &str, h: &HistogramSnapshot) {
        self.family(name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        for &(bound, count) in &h.buckets {
            self.sample_u64(&bucket, &[("le", &format_value(bound))], count);
        }
        self.sample_u64(&bucket, &[("le", "+Inf")], h.count);
        self.sample(&format!("{name}_sum"), &[], h.sum);
        self.sample_u64(&format!("{name}_count"), &[], h.count);
    }

    /// The exposition text.
    pub fn finish(self) -> String {
        self.out
    }

    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.out.push('{');
        for (i, (name, value)) in labels.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            let _ = write!(self.out, "{name}=\"{}\"", escape_label(value));
        }
        self.out.push('}');
    }
}

/// Help text: backslash and line feed escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Label values: backslash, double quote and line feed escaped.
fn escape_label(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Below this, an `f64` holds every integer exactly (2^53).
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// Integers without a fraction, large values in exponent form, others as Rust prints
/// them; `+Inf`, `-Inf`, `NaN`.
fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if value.fract() == 0.0 && value.abs() < EXACT_INTEGERS {
        format!("{}", value as i64)
    } else if value.abs() >= EXACT_INTEGERS {
        format!("{value:e}")
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_then_samples() {
        let mut e = TextEncoder::default();
        e.single(
            "psm_up",
            Kind::Gauge,
            "Whether it is up.\nSecond line \\ end",
            1.0,
        );
        e.family("psm_requests_total", Kind::Counter, "Requests.");
        e.sample_u64("psm_requests_total", &[("status", "200")], 3);
        e.sample(
            "psm_requests_total",
            &[("status", "4\"0\\1\n"), ("code", "x")],
            0.5,
        );
        e.single_u64("psm_lsn", Kind::Gauge, "An LSN.", u64::MAX);
        assert_eq!(
            e.finish(),
            "# HELP psm_up Whether it is up.\\nSecond line \\\\ end\n\
             # TYPE psm_up gauge\n\
             psm_up 1\n\
             # HELP psm_requests_total Requests.\n\
             # TYPE psm_requests_total counter\n\
             psm_requests_total{status=\"200\"} 3\n\
             psm_requests_total{status=\"4\\\"0\\\\1\\n\",code=\"x\"} 0.5\n\
             # HELP psm_lsn An LSN.\n\
             # TYPE psm_lsn gauge\n\
             psm_lsn 18446744073709551615\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let snapshot = HistogramSnapshot {
            buckets: vec![(0.005, 1), (0.1, 3), (1.0, 3)],
            sum: 2.25,
            count: 4,
        };
        let mut e = TextEncoder::default();
        e.histogram("psm_latency_seconds", "Latency.", &snapshot);
        assert_eq!(
            e.finish(),
            "# HELP psm_latency_seconds Latency.\n\
             # TYPE psm_latency_seconds histogram\n\
             psm_latency_seconds_bucket{le=\"0.005\"} 1\n\
             psm_latency_seconds_bucket{le=\"0.1\"} 3\n\
             psm_latency_seconds_bucket{le=\"1\"} 3\n\
             psm_latency_seconds_bucket{le=\"+Inf\"} 4\n\
             psm_latency_seconds_sum 2.25\n\
             psm_latency_seconds_count 4\n"
        );
    }

    #[test]
    fn values_print_like_prometheus_expects() {
        assert_eq!(format_value(0.0), "0");
        assert_eq!(format_value(123_456_789.0), "123456789");
        assert_eq!(format_value(0.25), "0.25");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
        assert_eq!(format_value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(1e300), "1e300");
        assert_eq!(format_value(-3.0), "-3");
    }
}
