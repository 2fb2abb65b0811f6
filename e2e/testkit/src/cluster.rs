//! One throwaway PostgreSQL cluster.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::install::PgInstall;
use crate::ports::free_port;
use crate::wait::{wait_for_explained, worker_progress, LiveTestTimer, Patience};

/// A temporary directory the cluster user may write to; removed on drop. It also times
/// the live test that made it, and prints the time when dropped.
pub struct TestDir {
    dir: tempfile::TempDir,
    /// The OS user the clusters run as, when not this process's.
    owner: Option<String>,
    _timer: LiveTestTimer,
}

impl TestDir {
    /// Creates the directory and hands it to the cluster user.
    pub fn new(install: &PgInstall) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("psm-test-")
            .tempdir()
            .expect("temp dir");
        let owner = install.run_as().map(str::to_owned);
        if let Some(user) = &owner {
            chown(user, dir.path());
        }
        Self {
            dir,
            owner,
            _timer: LiveTestTimer::start(),
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file readable by the cluster user.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write test file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        path
    }

    /// Writes `text` to `name` readable by the clusters' user alone (mode 0600, owned by
    /// it), as a secret file must be; returns its path.
    pub fn write_private(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write test file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        if let Some(user) = &self.owner {
            chown(user, &path);
        }
        path
    }
}

/// Hands `path` to the OS user `user`.
fn chown(user: &str, path: &Path) {
    let status = Command::new("chown")
        .arg(user)
        .arg(path)
        .status()
        .expect("chown runs");
    assert!(status.success(), "chown {user} {} failed", path.display());
}

/// Server log lines a failed test prints per cluster.
const LOG_TAIL_ON_FAILURE: usize = 60;

/// What the cluster is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterKind {
    /// The source: `wal_level=logical`, room for slots and senders.
    Primary,
    /// The sync replica: `shared_preload_libraries=powersync_mdbx`.
    SyncReplica,
    /// A plain server (the extension installed but not preloaded).
    Plain,
}

/// A running (or stopped) cluster. Dropping it stops the postmaster by pid.
pub struct Cluster {
    install: PgInstall,
    data: PathBuf,
    socket_dir: PathBuf,
    log: PathBuf,
    port: u16,
    /// The postmaster's pid as of the last start: lets `drop` stop it even when the test
    /// directory (with `postmaster.pid`) was removed first.
    started_pid: std::cell::Cell<Option<i32>>,
}

impl Cluster {
    /// A sync replica named `replica` inside `dir`: `config` written to `config.yaml`,
    /// the worker preloaded with it (plus `extra_conf` lines), and the extension created.
    pub fn start_sync_replica(
        install: &PgInstall,
        dir: &TestDir,
        config: &str,
        extra_conf: &[String],
    ) -> Self {
        Self::start_sync_replica_named(install, dir, "replica", config, extra_conf)
    }

    /// [`Self::start_sync_replica`] under another name (several replicas in one
    /// directory): the config is written to `<name>.yaml`.
    pub fn start_sync_replica_named(
        install: &PgInstall,
        dir: &TestDir,
        name: &str,
        config: &str,
        extra_conf: &[String],
    ) -> Self {
        let file = if name == "replica" {
            "config.yaml".to_owned()
        } else {
            format!("{name}.yaml")
        };
        let path = dir.write(&file, config);
        let mut conf = vec![format!("powersync_mdbx.config_file = '{}'", path.display())];
        conf.extend(extra_conf.iter().cloned());
        let replica = Self::start_new(install, dir, name, ClusterKind::SyncReplica, &conf);
        replica.sql("CREATE EXTENSION powersync_mdbx");
        replica
    }

    /// The worker's `powersync_mdbx.status()`, `None` while it cannot be read.
    pub fn worker_status(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.try_sql("SELECT powersync_mdbx.status()").ok()?).ok()
    }

    /// Waits while the worker advances (its status, [`worker_progress`]) until `probe`
    /// accepts its status; returns what `probe` returned.
    pub fn wait_worker<T>(
        &self,
        what: &str,
        mut probe: impl FnMut(&serde_json::Value) -> Option<T>,
    ) -> T {
        wait_for_explained(
            what,
            || {
                let status = self.worker_status();
                let status = status.as_ref();
                status
                    .and_then(&mut probe)
                    .ok_or_else(|| status.map(worker_progress))
            },
            |failure| {
                let log = self.log_text();
                let tail = &log[log.ceil_char_boundary(log.len().saturating_sub(4000))..];
                format!("{failure}\nserver log (tail):\n{tail}")
            },
        )
    }

    /// Waits until this sync replica's worker applied everything committed on `primary`
    /// so far (a logical message marks the point, so an idle primary is passed too).
    pub fn wait_applied(&self, primary: &Cluster) {
        primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
        let head = primary.sql("SELECT pg_current_wal_lsn()");
        self.wait_worker("the worker applying up to the primary's head", |_| {
            let done = self
                .try_sql(&format!(
                    "SELECT applied_lsn >= '{head}' FROM powersync_mdbx.replication()"
                ))
                .ok()?;
            (done == "t").then_some(())
        });
    }

    /// Waits for the worker's status to show `phase`; returns it.
    pub fn wait_worker_phase(&self, phase: &str) -> serde_json::Value {
        self.wait_worker(&format!("the worker in phase {phase}"), |s| {
            (s["phase"] == phase).then(|| s.clone())
        })
    }

    /// Creates and starts a cluster named `name` inside `dir`, with `extra_conf` lines
    /// appended to `postgresql.conf`.
    pub fn start_new(
        install: &PgInstall,
        dir: &TestDir,
        name: &str,
        kind: ClusterKind,
        extra_conf: &[String],
    ) -> Self {
        if kind != ClusterKind::Primary {
            install.require_extension();
        }
        let data = dir.path().join(name);
        let socket_dir = dir.path().join(format!("{name}.sock"));
        let log = dir.path().join(format!("{name}.log"));
        if let Err(e) = run(install
            .command("initdb")
            .args([
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth=trust",
                "-U",
                "postgres",
                "-D",
            ])
            .arg(&data))
        {
            panic!("{e}");
        }
        let port = free_port();
        let mut conf = Vec::new();
        match kind {
            ClusterKind::Primary => conf.extend([
                "wal_level = logical".to_owned(),
                "max_replication_slots = 10".to_owned(),
                "max_wal_senders = 10".to_owned(),
            ]),
            ClusterKind::SyncReplica => {
                conf.push("shared_preload_libraries = 'powersync_mdbx'".to_owned())
            }
            ClusterKind::Plain => {}
        }
        conf.extend(extra_conf.iter().cloned());
        configure(install, &data, &socket_dir, port, &conf);
        Self::started(install, data, socket_dir, log, port)
    }

    /// The configured cluster in `data`, started.
    fn started(
        install: &PgInstall,
        data: PathBuf,
        socket_dir: PathBuf,
        log: PathBuf,
        port: u16,
    ) -> Self {
        let cluster = Self {
            install: install.clone(),
            data,
            socket_dir,
            log,
            port,
            started_pid: std::cell::Cell::new(None),
        };
        cluster.start();
        cluster
    }

    /// Creates and starts a physical standby of `primary` named `name` inside `dir`
    /// (`pg_basebackup -R`: it streams from the primary until [`Self::promote`]).
    pub fn start_standby(
        install: &PgInstall,
        dir: &TestDir,
        name: &str,
        primary: &Cluster,
    ) -> Self {
        Self::start_standby_with(install, dir, name, primary, &[])
    }

    /// [`Self::start_standby`] with `extra_conf` lines in its `postgresql.conf`
    /// (`primary_slot_name`, `sync_replication_slots`, …).
    pub fn start_standby_with(
        install: &PgInstall,
        dir: &TestDir,
        name: &str,
        primary: &Cluster,
        extra_conf: &[String],
    ) -> Self {
        let data = dir.path().join(name);
        let socket_dir = dir.path().join(format!("{name}.sock"));
        let log = dir.path().join(format!("{name}.log"));
        if let Err(e) = run(install
            .command("pg_basebackup")
            .args(["--no-sync", "-R", "-X", "stream", "-d"])
            .arg(primary.uri("postgres"))
            .arg("-D")
            .arg(&data))
        {
            panic!("{e}");
        }
        let port = free_port();
        configure(install, &data, &socket_dir, port, extra_conf);
        Self::started(install, data, socket_dir, log, port)
    }

    /// Promotes a standby (`pg_ctl promote`, waiting until it accepts writes): it starts
    /// a new timeline.
    pub fn promote(&self) {
        self.pg_ctl(&[], "promote");
    }

    /// Runs `pg_ctl -w … -D <data> <options> <action>`, panicking with its error (and the
    /// server log) when it fails.
    fn pg_ctl(&self, options: &[&std::ffi::OsStr], action: &str) {
        let out = self
            .install
            .command("pg_ctl")
            .args(["-w", "-t", &pg_ctl_wait(), "-D"])
            .arg(&self.data)
            .args(options)
            .arg(action)
            .output()
            .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl {action} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
    }

    /// Starts the postmaster and waits until it accepts connections.
    pub fn start(&self) {
        self.pg_ctl(&["-l".as_ref(), self.log.as_os_str()], "start");
        self.started_pid.set(self.postmaster_pid());
    }

    /// `pg_ctl stop -m fast`; returns how long it took.
    pub fn stop_fast(&self) -> Duration {
        let started = Instant::now();
        self.pg_ctl(&["-m".as_ref(), "fast".as_ref()], "stop");
        started.elapsed()
    }

    /// `pg_ctl stop -m immediate`: the server and the worker end at once, as in a crash.
    pub fn stop_immediate(&self) {
        self.pg_ctl(&["-m".as_ref(), "immediate".as_ref()], "stop");
    }

    /// The postmaster's pid, while it runs.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// A libpq URI for the `postgres` database over TCP without TLS.
    pub fn uri(&self, user: &str) -> String {
        format!(
            "postgresql://{user}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// Runs SQL with `psql` (`ON_ERROR_STOP`), returning unaligned tuples-only output or
    /// psql's error text.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        let out = self.psql().args(["-c", sql]).output().expect("psql runs");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The installation this cluster runs.
    pub(crate) fn install(&self) -> &PgInstall {
        &self.install
    }

    /// `psql` connected to this cluster as `postgres`: unaligned, tuples only, stopping
    /// at the first error.
    fn psql(&self) -> Command {
        let mut cmd = Command::new(self.install.program("psql"));
        cmd.arg("-h")
            .arg(&self.socket_dir)
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"]);
        cmd
    }

    /// Runs a SQL file with psql variables (`-v name=value`), panicking on an error.
    pub fn sql_file(&self, path: &Path, vars: &[(&str, &str)]) -> String {
        let mut cmd = self.psql();
        for (name, value) in vars {
            cmd.arg("-v").arg(format!("{name}={value}"));
        }
        let out = cmd.arg("-f").arg(path).output().expect("psql runs");
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }

    /// Runs SQL and panics on an error.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Drops replication slot `slot` once no walsender holds it: a client that just
    /// disconnected leaves its walsender running a moment, and a drop then fails with
    /// "is active".
    pub fn drop_slot(&self, slot: &str) {
        crate::wait::wait_until(&format!("slot {slot} released by its walsender"), || {
            let active = self.sql(&format!(
                "SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"
            ));
            (active != "t").then_some(())
        });
        self.sql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
    }

    /// Runs each statement in a transaction of its own (`ALTER SYSTEM`, a migration in
    /// steps), in order; panics on an error.
    pub fn sql_each(&self, statements: &[&str]) {
        for statement in statements {
            self.sql(statement);
        }
    }

    /// The server log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A failed test shows what the server said last (its directory goes with it).
        if std::thread::panicking() {
            let text = self.log_text();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL_ON_FAILURE)..].join("\n");
            eprintln!(
                "server log of {} (last {LOG_TAIL_ON_FAILURE} lines):\n{tail}",
                self.data.display()
            );
        }
        let started = self.started_pid.get().filter(|pid| {
            // Only a live postgres process: the pid may have been reused.
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(8).any(|w| w == b"postgres"))
        });
        let Some(pid) = self.postmaster_pid().or(started) else {
            return;
        };
        // SAFETY: signalling a process id we read from our own cluster's postmaster.pid.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(20);
        // SAFETY: kill with signal 0 only checks that the process exists.
        while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above; last resort so no server outlives the test.
        if unsafe { libc::kill(pid, 0) } == 0 {
            // SAFETY: the same process, still there after 20 s: it cannot outlive the test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Makes `socket_dir` for the cluster user and appends the test rig's settings (port,
/// loopback, the socket directory, no fsync, small memory) and `extra` to the data
/// directory's `postgresql.conf`.
fn configure(install: &PgInstall, data: &Path, socket_dir: &Path, port: u16, extra: &[String]) {
    std::fs::create_dir(socket_dir).expect("socket dir");
    if let Some(user) = install.run_as() {
        chown(user, socket_dir);
    }
    let mut conf = vec![
        format!("port = {port}"),
        "listen_addresses = '127.0.0.1'".to_owned(),
        format!("unix_socket_directories = '{}'", socket_dir.display()),
        "fsync = off".to_owned(),
        "full_page_writes = off".to_owned(),
        "max_connections = 30".to_owned(),
        "shared_buffers = 32MB".to_owned(),
    ];
    conf.extend(extra.iter().cloned());
    let conf_path = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf_path).expect("read postgresql.conf");
    text.push_str("\n# powersync_mdbx test rig\n");
    text.push_str(&conf.join("\n"));
    text.push('\n');
    std::fs::write(&conf_path, text).expect("write postgresql.conf");
}

/// How long `pg_ctl` waits for a start or stop: the run's stall limit, in seconds.
fn pg_ctl_wait() -> String {
    Patience::of_run().stall.as_secs().to_string()
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(out)
    } else {
        let message = format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Err(message)
    }
}
