//! The command line: the flags every scenario shares, and the reader that takes flags
//! one by one.

use std::time::Duration;

/// The flags every scenario shares.
pub struct Common {
    /// Streams to open.
    pub streams: usize,
    /// The tokens' HS256 secret.
    pub secret: String,
    /// The tokens' audience.
    pub audience: String,
    /// Users are `<prefix><i>`.
    pub user_prefix: String,
    /// Lifetime of each token.
    pub token_seconds: u64,
    /// Connections being set up at once.
    pub connects: usize,
    /// Loopback source addresses the connections are spread over.
    pub sources: usize,
    /// How long a phase (opening, a fan-out) may wait.
    pub timeout: Duration,
    /// `identity`, `zstd` or `gzip`.
    pub coding: String,
    /// The sync worker's pid, for its memory and CPU time.
    pub worker_pid: Option<u32>,
}

impl Common {
    /// Stream `i`'s user id (the token's `sub`).
    pub fn user(&self, i: usize) -> String {
        format!("{}{i}", self.user_prefix)
    }
}

/// Command-line flags (`--name value`), taken one by one; what is left over is an error.
pub struct Flags(Vec<(String, String)>);

impl Flags {
    /// Reads `args` as `--name value` pairs.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut pairs = Vec::new();
        let mut it = args.iter();
        while let Some(name) = it.next() {
            if !name.starts_with("--") {
                return Err(format!("unexpected argument {name}"));
            }
            let value = it.next().ok_or_else(|| format!("{name} needs a value"))?;
            pairs.push((name.clone(), value.clone()));
        }
        Ok(Self(pairs))
    }

    /// The value of `name` (its last occurrence), removed.
    pub fn take(&mut self, name: &str) -> Option<String> {
        let mut value = None;
        self.0.retain(|(n, v)| {
            if n == name {
                value = Some(v.clone());
                false
            } else {
                true
            }
        });
        value
    }

    /// The value of `name` parsed, removed.
    pub fn parsed<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.take(name)
            .map(|v| v.parse().map_err(|_| format!("{name}: cannot parse {v:?}")))
            .transpose()
    }

    /// The value of `name`, removed; an error when it is missing.
    pub fn required(&mut self, name: &str) -> Result<String, String> {
        self.take(name).ok_or_else(|| format!("{name} is required"))
    }

    /// An error naming the first flag left over.
    pub fn finish(self) -> Result<(), String> {
        match self.0.first() {
            Some((name, _)) => Err(format!("unknown flag {name}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_taken_and_leftovers_refused() {
        let args: Vec<String> = ["--port", "9", "--streams", "x", "--bogus", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut flags = Flags::parse(&args).unwrap();
        assert_eq!(flags.parsed::<u16>("--port").unwrap(), Some(9));
        assert!(flags.parsed::<usize>("--streams").is_err());
        assert_eq!(flags.finish().unwrap_err(), "unknown flag --bogus");
        assert!(Flags::parse(&["--port".to_string()]).is_err());
    }
}
