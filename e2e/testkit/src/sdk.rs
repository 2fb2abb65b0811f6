//! The official PowerSync JavaScript SDK as a test client: runs `e2e/client.mjs` (installed
//! by `e2e/install.sh`) with the Node.js from `e2e/node_modules`, one JSON line per answer.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::Value;

use crate::wait::Patience;

/// How long the client waits for the first sync and for a command's condition: the run's
/// stall limit ([`Patience`]). The SDK shows no progress of its own while it syncs, so its
/// waits are bounded by that limit alone.
fn client_wait() -> Duration {
    Patience::of_run().stall
}

/// How much longer the rig waits for an answer than the client waits for its condition.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// Where the e2e client lives: `e2e/` beside the workspace root.
pub(crate) fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Node.js binary and `client.mjs`, when the e2e packages are installed
/// (`PSM_E2E_NODE` overrides the binary).
pub fn sdk_client_installed() -> Option<(PathBuf, PathBuf)> {
    let dir = e2e_dir();
    let node = std::env::var_os("PSM_E2E_NODE")
        .map_or_else(|| dir.join("node_modules/.bin/node"), PathBuf::from);
    let sdk = dir.join("node_modules/@powersync/node/package.json");
    (node.exists() && sdk.exists()).then(|| (node, dir.join("client.mjs")))
}

/// The Node.js binary and `client.mjs`; fails the test that needs them, with the fix,
/// when the e2e packages are not installed.
pub fn require_sdk_client() -> (PathBuf, PathBuf) {
    sdk_client_installed().unwrap_or_else(|| {
        panic!(
            "the e2e SDK client is not installed ({} or @powersync/node missing): run \
             e2e/install.sh (scripts/setup.sh does)",
            e2e_dir().join("node_modules/.bin/node").display()
        )
    })
}

/// How to run the client: the environment of `e2e/client.mjs`.
#[derive(Debug, Clone)]
pub struct SdkClient {
    node: PathBuf,
    script: PathBuf,
    env: Vec<(String, String)>,
}

impl SdkClient {
    /// A client of `endpoint` that signs HS256 tokens for `user` with the base64url
    /// `secret`, keeps its SQLite database in `db_dir` and uploads to `primary_uri`.
    /// `None` when the e2e packages are not installed.
    pub fn new(
        endpoint: &str,
        secret_b64url: &str,
        user: &str,
        db_dir: &Path,
        primary_uri: &str,
    ) -> Option<Self> {
        let (node, script) = sdk_client_installed()?;
        let env = [
            ("PSM_ENDPOINT", endpoint),
            ("PSM_JWT_SECRET", secret_b64url),
            ("PSM_USER", user),
            ("PSM_DB_DIR", &db_dir.display().to_string()),
            ("PSM_PRIMARY_URI", primary_uri),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .chain([(
            "PSM_TIMEOUT_MS".to_owned(),
            client_wait().as_millis().to_string(),
        )])
        .collect();
        Some(Self { node, script, env })
    }

    /// The same client with one more environment variable.
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    fn command(&self, scenario: &str) -> Command {
        let mut cmd = Command::new(&self.node);
        cmd.arg(&self.script)
            .arg(scenario)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        cmd
    }

    /// Runs `scenario` to its end and returns its JSON line; panics with the line when the
    /// client failed.
    pub fn run(&self, scenario: &str) -> Value {
        let out = self
            .command(scenario)
            .stdin(Stdio::null())
            .output()
            .expect("node runs");
        finished_run(&out, &format!("e2e client `{scenario}`"))
    }

    /// Runs the same setup in a real browser: `e2e/browser.mjs` bundles the official
    /// `@powersync/web` SDK into a page, serves it on a loopback port and drives it in
    /// headless Chromium until it has synced; the page's screenshot goes to `screenshot`.
    /// Returns the page's result (rows, their digest, buckets, SDK warnings); panics with
    /// it when the page failed, and with the fix when the browser or the web SDK is
    /// missing.
    pub fn run_in_browser(&self, screenshot: &Path) -> Value {
        let dir = e2e_dir();
        let chromium = std::env::var_os("PSM_CHROMIUM")
            .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
        assert!(
            chromium.exists(),
            "no browser at {}: apt-get install chromium (scripts/setup.sh does)",
            chromium.display()
        );
        assert!(
            dir.join("node_modules/@powersync/web/package.json")
                .exists()
                && dir
                    .join("node_modules/puppeteer-core/package.json")
                    .exists(),
            "the web SDK or puppeteer-core is not installed in e2e/node_modules: run \
             e2e/install.sh (scripts/setup.sh does)"
        );
        let out = Command::new(&self.node)
            .arg(dir.join("browser.mjs"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("PSM_CHROMIUM", &chromium)
            .env("PSM_SCREENSHOT", screenshot)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .expect("node runs");
        finished_run(&out, "the web SDK in Chromium")
    }

    /// Starts the `watch` scenario and waits for its first-sync line.
    pub fn watch(&self) -> WatchClient {
        let mut child = self
            .command("watch")
            .stdin(Stdio::piped())
            .spawn()
            .expect("node starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut client = WatchClient {
            child,
            stdin,
            lines,
        };
        let first = client.next_line(client_wait() + ANSWER_MARGIN, "the first sync");
        assert!(
            first["ok"] == true,
            "e2e client `watch` failed: {}",
            summarize(&first)
        );
        client
    }
}

/// A running `watch` client; killed on drop.
pub struct WatchClient {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl WatchClient {
    fn next_line(&mut self, timeout: Duration, what: &str) -> Value {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("client printed a non-JSON line ({e}): {line}")),
            Err(_) => {
                let status = self.child.try_wait().ok().flatten();
                panic!("no answer from the e2e client within {timeout:?} for {what} (exit status: {status:?})")
            }
        }
    }

    /// Sends one command and returns the answer, whatever its `ok`.
    pub fn try_send(&mut self, cmd: &Value) -> Value {
        let timeout = cmd["timeout_ms"]
            .as_u64()
            .map_or_else(client_wait, Duration::from_millis);
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{cmd}").expect("write to the client");
        stdin.flush().expect("flush");
        self.next_line(timeout + ANSWER_MARGIN, &cmd.to_string())
    }

    /// Sends one command and panics unless the answer is `ok`.
    pub fn send(&mut self, cmd: &Value) -> Value {
        let answer = self.try_send(cmd);
        assert!(
            answer["ok"] == true,
            "e2e client command {cmd} failed: {}",
            summarize(&answer)
        );
        answer
    }

    /// Closes stdin and waits for a clean exit.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("wait for node");
        assert!(status.success(), "e2e client exited with {status}");
    }
}

impl Drop for WatchClient {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A failure line without the (large) row dumps.
/// The last JSON line a finished client printed; panics with it when the run failed.
fn finished_run(out: &std::process::Output, what: &str) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    let value: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{what} printed no JSON line ({e}): {text}"));
    assert!(
        out.status.success() && value["ok"] == true,
        "{what} failed ({}): {}",
        out.status,
        summarize(&value)
    );
    value
}

fn summarize(value: &Value) -> String {
    let mut v = value.clone();
    if let Some(obj) = v.as_object_mut() {
        if obj.remove("tables").is_some() {
            obj.insert("tables".into(), Value::String("(omitted)".into()));
        }
    }
    let text = v.to_string();
    if text.len() > 4000 {
        format!("{}…", &text[..text.floor_char_boundary(4000)])
    } else {
        text
    }
}
