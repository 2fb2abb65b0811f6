//! Where the PostgreSQL binaries are, and who runs them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Default location `scripts/setup.sh` unpacks PostgreSQL 16 to.
const DEFAULT_PG16_BIN: &str = "/opt/powersync-mdbx/pg16/pgserver/pginstall/bin";
/// Debian's PostgreSQL 15.
const DEFAULT_PG15_BIN: &str = "/usr/lib/postgresql/15/bin";
/// Default unprivileged user for clusters when running as root.
const DEFAULT_TEST_USER: &str = "powersync_test";

/// A PostgreSQL installation (its `bin` directory) and the OS user that runs its servers.
#[derive(Debug, Clone)]
pub struct PgInstall {
    bin: PathBuf,
    run_as: Option<String>,
    /// Environment variables its programs (and so its servers) run with.
    env: Vec<(String, String)>,
}

impl PgInstall {
    /// PostgreSQL 16 from `PSM_PG16_BIN`, or the path `scripts/setup.sh` uses.
    pub fn pg16() -> Self {
        let bin = std::env::var_os("PSM_PG16_BIN")
            .map_or_else(|| PathBuf::from(DEFAULT_PG16_BIN), PathBuf::from);
        Self::at(bin)
    }

    /// The primary of the live tests: `PSM_PRIMARY_BIN` when set (the version matrix of
    /// `scripts/test.sh` runs PostgreSQL 13, 14, 17 and 18 there, from
    /// `scripts/install_primaries.sh`), else [`Self::pg16`]. The sync replica stays
    /// [`Self::pg16`].
    pub fn primary() -> Self {
        match std::env::var_os("PSM_PRIMARY_BIN") {
            Some(bin) => Self::at(PathBuf::from(bin)).with_own_libraries(),
            None => Self::pg16(),
        }
    }

    /// The same installation, its programs (and servers) loading its own libraries first:
    /// the matrix's servers carry no library path, so theirs would otherwise load the
    /// system's libpq (Debian's, of PostgreSQL 15), which cannot parse what a newer
    /// `pg_basebackup -R` writes (`sslnegotiation`) and stops a standby's slot sync.
    fn with_own_libraries(self) -> Self {
        let lib = self.bin.parent().map(|root| root.join("lib"));
        match lib.filter(|lib| lib.join("libpq.so.5").exists()) {
            Some(lib) => self.with_env("LD_LIBRARY_PATH", &lib.display().to_string()),
            None => self,
        }
    }

    /// The matrix's PostgreSQL `major` (`scripts/install_primaries.sh` puts it in
    /// `$PSM_TOOLS/pg<major>/bin`, `PSM_TOOLS` defaulting to `/opt/powersync-mdbx`).
    pub fn primary_of_major(major: u32) -> Self {
        let tools = std::env::var("PSM_TOOLS").unwrap_or_else(|_| "/opt/powersync-mdbx".into());
        let bin = PathBuf::from(tools).join(format!("pg{major}")).join("bin");
        assert!(
            bin.join("postgres").exists(),
            "no PostgreSQL {major} in {}: run scripts/install_primaries.sh (scripts/setup.sh does)",
            bin.display()
        );
        Self::at(bin).with_own_libraries()
    }

    /// The matrix's primary when it has failover slots (PostgreSQL 17+), else the
    /// matrix's PostgreSQL 17.
    pub fn primary_with_failover_slots() -> Self {
        let install = Self::primary();
        if install.major() >= 17 {
            install
        } else {
            Self::primary_of_major(17)
        }
    }

    /// The server's major version (`postgres --version`).
    pub fn major(&self) -> u32 {
        let out = Command::new(self.bin.join("postgres"))
            .arg("--version")
            .output()
            .expect("postgres --version runs");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .last()
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no version in `postgres --version`: {text}"))
    }

    /// Debian's PostgreSQL 15 (`PSM_PG15_BIN`, default `/usr/lib/postgresql/15/bin`): built
    /// with OpenSSL, so it can be a primary with `ssl = on` (the PostgreSQL 16 in use has
    /// no TLS).
    pub fn pg15() -> Self {
        let bin = std::env::var_os("PSM_PG15_BIN")
            .map_or_else(|| PathBuf::from(DEFAULT_PG15_BIN), PathBuf::from);
        Self::at(bin)
    }

    /// The installation whose binaries are in `bin`.
    pub fn at(bin: PathBuf) -> Self {
        assert!(
            bin.join("postgres").exists(),
            "no PostgreSQL server in {}: run scripts/setup.sh (or set PSM_PG16_BIN)",
            bin.display()
        );
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let run_as = root.then(|| {
            std::env::var("PSM_TEST_USER").unwrap_or_else(|_| DEFAULT_TEST_USER.to_owned())
        });
        Self {
            bin,
            run_as,
            env: Vec::new(),
        }
    }

    /// The same installation whose programs, and the servers `pg_ctl` starts, also have
    /// `name=value` in their environment.
    pub fn with_env(&self, name: &str, value: &str) -> Self {
        let mut install = self.clone();
        install.env.push((name.to_owned(), value.to_owned()));
        install
    }

    /// The `bin` directory.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The OS user clusters run as, when not the current user.
    pub fn run_as(&self) -> Option<&str> {
        self.run_as.as_deref()
    }

    /// `pg_config --pkglibdir` of this installation.
    pub fn pkglibdir(&self) -> PathBuf {
        let out = Command::new(self.bin.join("pg_config"))
            .arg("--pkglibdir")
            .output()
            .expect("pg_config runs");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// Panics with the fix when the extension is not installed into this PostgreSQL.
    pub fn require_extension(&self) {
        let so = self.pkglibdir().join("powersync_mdbx.so");
        assert!(
            so.exists(),
            "{} is missing: install the extension first (scripts/test.sh does: cargo pgrx install \
             --pg-config {}/pg_config)",
            so.display(),
            self.bin.display()
        );
    }

    /// The path of `program`: this installation's, or for a client program it lacks
    /// (`psql`: the primaries of the version matrix ship only the server) PostgreSQL 16's.
    pub fn program(&self, program: &str) -> PathBuf {
        let own = self.bin.join(program);
        if own.exists() {
            own
        } else {
            Self::pg16().bin.join(program)
        }
    }

    /// A command for one of this installation's programs, run as the cluster user.
    pub fn command(&self, program: &str) -> Command {
        let path = self.program(program);
        match &self.run_as {
            Some(user) => {
                // `env` sets the variables after `runuser` switched users.
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--", "env"])
                    .args(self.env.iter().map(|(k, v)| format!("{k}={v}")))
                    .arg(path);
                cmd
            }
            None => {
                let mut cmd = Command::new(path);
                cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
                cmd
            }
        }
    }
}
