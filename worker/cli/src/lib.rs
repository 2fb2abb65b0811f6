//! The `powersync-mdbx` command-line tool (kept out of the binary so it can be tested).
//!
//! `rules check` lets an operator validate sync rules before deploying them; `rules eval`
//! shows exactly what one row produces (ops, lookups) and which buckets a token gets.
#![warn(missing_docs)]

mod rules_cmd;

use std::io::Write;

/// Usage text.
pub const USAGE: &str = "\
usage:
  powersync-mdbx rules check FILE
  powersync-mdbx rules eval FILE --table [SCHEMA.]TABLE --row JSON
                 [--claims JSON] [--params JSON] [--subscribe STREAM[=JSON]]...
                 [--no-defaults] [--generation N]

`check` prints the official compiler's warnings on stderr; they do not fail it.

--row maps each column, in table order, to its PostgreSQL type and text value:
  '{\"id\":{\"type\":\"text\",\"value\":\"t1\"},\"n\":{\"type\":\"int8\",\"value\":\"5\"}}'
  (\"value\": null is SQL NULL; \"oid\": 20 may be given instead of \"type\").
Output: one JSON object per line (ops, lookups, then request buckets with --claims).
";

/// Run the tool with `args` (without the program name); returns the exit code.
pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let result = match args.first().map(String::as_str) {
        Some("rules") => rules_cmd::run(&args[1..], out, err),
        Some("help") | Some("--help") | Some("-h") => {
            let _ = write!(out, "{USAGE}");
            return 0;
        }
        _ => Err(CliError::Usage("expected a command".into())),
    };
    match result {
        Ok(()) => 0,
        Err(CliError::Usage(m)) => {
            let _ = writeln!(err, "error: {m}\n\n{USAGE}");
            2
        }
        Err(CliError::Failed(m)) => {
            let _ = writeln!(err, "error: {m}");
            1
        }
    }
}

/// A CLI failure: bad usage (exit 2) or a failed check/evaluation (exit 1).
#[derive(Debug)]
pub enum CliError {
    /// The command line is wrong.
    Usage(String),
    /// The rules or input are wrong.
    Failed(String),
}
