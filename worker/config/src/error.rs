//! Errors in the service configuration: each names the file, the key and the fix.

use std::path::PathBuf;

/// A configuration file that cannot be used. The operator fixes the file and reloads
/// (`SELECT pg_reload_conf()` or SIGHUP); the worker waits instead of restarting in a loop.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No file is configured at all.
    #[error(
        "PSM_C1001 no configuration file: set powersync_mdbx.config_file in postgresql.conf \
         to the path of a PowerSync service config (YAML), then reload"
    )]
    NotConfigured,
    /// The file (or a file it references) cannot be read.
    #[error(
        "PSM_C1002 cannot read {path}: {source}; check the path and that the PostgreSQL \
             server user can read it"
    )]
    Unreadable {
        /// The file that failed.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The YAML does not parse, or a key has the wrong type.
    #[error("PSM_C1003 {path}: invalid YAML: {message}")]
    Syntax {
        /// The configuration file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A required key is absent.
    #[error("PSM_C1004 {path}: missing `{key}`: {hint}")]
    Missing {
        /// The configuration file.
        path: PathBuf,
        /// Dotted path of the missing key.
        key: &'static str,
        /// What to put there.
        hint: &'static str,
    },
    /// A key holds a value the engine cannot use.
    #[error("PSM_C1005 {path}: `{key}`: {message}")]
    Invalid {
        /// The configuration file.
        path: PathBuf,
        /// Dotted path of the key.
        key: String,
        /// What is wrong and what is accepted.
        message: String,
    },
    /// A `!env NAME` tag names a variable that is not set in the server's environment.
    #[error(
        "PSM_C1006 {path}: `!env {name}` is not set in the PostgreSQL server's environment; \
             set it where the server starts, or write the value into the file"
    )]
    MissingEnv {
        /// The configuration file.
        path: PathBuf,
        /// The variable's name.
        name: String,
    },
    /// A setting of postgresql.conf (`powersync_mdbx.*`) holds a value the engine cannot
    /// use; the message names it and what is accepted.
    #[error("PSM_C1007 {message}; fix it in postgresql.conf, then reload")]
    Setting {
        /// What is wrong and what is accepted.
        message: String,
    },
}
