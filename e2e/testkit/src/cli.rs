//! The official `powersync` CLI (npm `powersync`, pinned in `e2e/package.json`) run by
//! the Node.js of `e2e/node_modules`, in a project directory of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What one CLI command did.
#[derive(Debug, Clone)]
pub struct CliRun {
    /// It exited with status 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl CliRun {
    /// Standard output and error together, for assertions on what a user reads.
    pub fn text(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// The CLI in `project`, with `PS_ADMIN_TOKEN` set to the admin token.
pub struct OfficialCli {
    node: PathBuf,
    entry: PathBuf,
    project: PathBuf,
    token: String,
}

impl OfficialCli {
    /// The CLI run in `project` (created if missing); panics with the fix when the e2e
    /// packages are not installed.
    pub fn new(project: &Path, token: &str) -> Self {
        let e2e = super::sdk::e2e_dir();
        let node = e2e.join("node_modules/.bin/node");
        let entry = e2e.join("node_modules/powersync/bin/run.js");
        assert!(
            node.exists() && entry.exists(),
            "the official powersync CLI is not installed ({} missing): run e2e/install.sh \
             (scripts/setup.sh does)",
            entry.display()
        );
        std::fs::create_dir_all(project).expect("the CLI's project directory");
        Self {
            node,
            entry,
            project: project.to_owned(),
            token: token.to_owned(),
        }
    }

    /// The project directory the CLI runs in.
    pub fn project(&self) -> &Path {
        &self.project
    }

    /// Runs `powersync <args>`, no terminal, within [`COMMAND_TIMEOUT`].
    pub fn run(&self, args: &[&str]) -> CliRun {
        let bin = self.node.parent().expect("node's directory");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = Command::new(&self.node)
            .arg(&self.entry)
            .args(args)
            .current_dir(&self.project)
            .env("PATH", path)
            .env("PS_ADMIN_TOKEN", &self.token)
            // Its own home: the CLI keeps settings there.
            .env("HOME", &self.project)
            .env("NO_COLOR", "1")
            .env("CI", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the powersync CLI starts");
        // Read on threads of their own: a full pipe would stop the CLI.
        let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut text = Vec::new();
                let _ = pipe.read_to_end(&mut text);
                String::from_utf8_lossy(&text).into_owned()
            })
        };
        let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
        let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
        // A command prints only when it ends, so it has no progress to watch: the run's
        // overall patience bounds it, as it bounds every wait.
        let within = crate::wait::Patience::of_run().overall;
        let started = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("the CLI's status") {
                break status;
            }
            if started.elapsed() > within {
                let _ = child.kill();
                panic!("powersync {args:?} did not finish within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        CliRun {
            success: status.success(),
            stdout: stdout.join().unwrap_or_default(),
            stderr: stderr.join().unwrap_or_default(),
        }
    }
}
