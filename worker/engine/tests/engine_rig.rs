//! The engine in-process against a real primary: a throwaway primary with a schema, the
//! engine streaming from it with given rules, an HS256 key and a free HTTP port.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use config::ServiceConfig;
use engine::{Engine, EngineConfig, EngineHandle};
use http::HttpLimits;
use serde_json::json;
use status::{Phase, StatusCell};
use testkit::{
    free_port, wait_for, worker_progress, Cluster, ClusterKind, Patience, PgInstall, TcpProxy,
    TestDir,
};

pub const SECRET: &[u8] = b"a test secret of thirty-two bytes!";
pub const AUDIENCE: &str = "powersync-mdbx-test";

/// One table of 3,000 todos, published.
pub const TODOS_SCHEMA: &str = "
CREATE TABLE todos (id text PRIMARY KEY, title text);
CREATE PUBLICATION powersync FOR TABLE todos;
INSERT INTO todos SELECT 't' || g, 'todo ' || g FROM generate_series(1, 3000) g;
";

/// Every todo in one global bucket.
pub const TODOS_RULES: &str = "
bucket_definitions:
  everything:
    data:
      - SELECT * FROM todos
";

pub struct EngineRig {
    _dir: TestDir,
    pub primary: Cluster,
    store: tempfile::TempDir,
    engine: Option<EngineHandle>,
    pub port: u16,
    pub status: Arc<StatusCell>,
    config: EngineConfig,
    /// Between the engine and the primary, when started with [`Self::start_proxied`].
    pub proxy: Option<TcpProxy>,
}

impl EngineRig {
    /// A primary with `schema`, and the engine streaming from it on slot `slot`.
    pub fn start(schema: &str, rules: &str, slot: &str) -> Self {
        Self::start_with(schema, rules, slot, "", None)
    }

    /// [`Self::start`] with `extra_yaml` appended to the configuration file (top-level
    /// sections such as `api:`) and the HTTP server's limits set.
    pub fn start_with(
        schema: &str,
        rules: &str,
        slot: &str,
        extra_yaml: &str,
        http_limits: Option<HttpLimits>,
    ) -> Self {
        Self::start_edited(schema, rules, slot, extra_yaml, |config| {
            config.http_limits = http_limits;
        })
    }

    /// [`Self::start_with`] whose engine configuration `edit` changes before the start
    /// (limits, ages).
    pub fn start_edited(
        schema: &str,
        rules: &str,
        slot: &str,
        extra_yaml: &str,
        edit: impl FnOnce(&mut EngineConfig),
    ) -> Self {
        let rig = Self::launch(
            schema,
            rules,
            slot,
            extra_yaml,
            &[],
            None::<fn(&TcpProxy)>,
            edit,
        );
        rig.wait_phase(Phase::Streaming);
        rig
    }

    /// A primary with `schema` and the primary's `settings` (`postgresql.conf` lines),
    /// and the engine reaching it through a [`TcpProxy`] (`rig.proxy`) that `prepare`
    /// may set up first; its configuration changed by `edit`. Returns at once (the
    /// engine may still be bootstrapping).
    pub fn start_proxied(
        schema: &str,
        rules: &str,
        slot: &str,
        settings: &[String],
        prepare: impl FnOnce(&TcpProxy),
        edit: impl FnOnce(&mut EngineConfig),
    ) -> Self {
        Self::launch(schema, rules, slot, "", settings, Some(prepare), edit)
    }

    fn launch(
        schema: &str,
        rules: &str,
        slot: &str,
        extra_yaml: &str,
        settings: &[String],
        proxied: Option<impl FnOnce(&TcpProxy)>,
        edit: impl FnOnce(&mut EngineConfig),
    ) -> Self {
        let install = PgInstall::pg16();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, settings);
        primary.sql(schema);
        let store = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config = engine_config(&primary, store.path(), port, rules, slot, extra_yaml);
        let proxy = proxied.map(|prepare| {
            let proxy = TcpProxy::start(primary.port());
            prepare(&proxy);
            config.service.source.port = proxy.port();
            proxy
        });
        edit(&mut config);
        let status = Arc::new(StatusCell::new(std::process::id()));
        let engine = Engine::start(config.clone(), status.clone()).unwrap();
        Self {
            _dir: dir,
            primary,
            store,
            engine: Some(engine),
            port,
            status,
            config,
            proxy,
        }
    }

    /// What the engine shows of its advance ([`worker_progress`] of its status).
    pub fn progress(&self) -> serde_json::Value {
        worker_progress(&serde_json::to_value(self.status.snapshot()).unwrap())
    }

    /// Waits while the engine advances until it reaches `phase`.
    pub fn wait_phase(&self, phase: Phase) {
        wait_for(&format!("the engine in phase {phase:?}"), || {
            if self.status.snapshot().phase == phase {
                Ok(())
            } else {
                Err(self.progress())
            }
        });
    }

    /// The storage directory.
    pub fn storage_dir(&self) -> std::path::PathBuf {
        self.config.storage_dir.clone()
    }

    /// Hands the running engine changed rules, as a configuration reload does.
    pub fn deploy_rules(&self, rules: &str) {
        self.engine.as_ref().unwrap().deploy_rules(rules);
    }

    /// Stops the engine, as a worker crash or restart would.
    pub fn stop(&mut self) {
        if let Some(engine) = self.engine.take() {
            assert!(
                engine.shutdown(Duration::from_secs(10)),
                "the engine stopped"
            );
        }
    }

    /// Starts an engine (after [`Self::stop`]) on the same storage, configured with
    /// `rules`.
    pub fn start_with_rules(&mut self, rules: &str) {
        assert!(self.engine.is_none(), "the engine is stopped first");
        self.config = engine_config(
            &self.primary,
            self.store.path(),
            self.port,
            rules,
            &self.config.slot_name,
            "",
        );
        self.engine = Some(Engine::start(self.config.clone(), self.status.clone()).unwrap());
    }
}

/// The engine's configuration: the primary, `rules`, an HS256 key, storage in
/// `<root>/store`.
pub fn engine_config(
    primary: &Cluster,
    root: &std::path::Path,
    port: u16,
    rules: &str,
    slot: &str,
    extra_yaml: &str,
) -> EngineConfig {
    {
        let k = base64_url(SECRET);
        let yaml = format!(
            "replication:\n  connections:\n    - uri: {uri}\n      sslmode: disable\n\
             sync_rules:\n  content: |\n{rules}\n\
             client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: k1, k: '{k}'}}\n\
             port: {port}\n{extra_yaml}",
            uri = primary.uri("postgres"),
            rules = rules
                .lines()
                .map(|l| format!("    {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        let service = ServiceConfig::parse(&root.join("config.yaml"), &yaml, &|_| None).unwrap();
        EngineConfig {
            service,
            storage_dir: root.join("store"),
            listen_addresses: vec!["127.0.0.1".into()],
            runtime_threads: 2,
            slot_name: slot.into(),
            admin_socket: None,
            http_limits: None,
            write_checkpoint_max_age: None,
            fleet: engine::Fleet::default(),
        }
    }
}

impl Drop for EngineRig {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown(Duration::from_secs(5));
        }
    }
}

pub fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An HS256 token for `sub`, valid for `lifetime` seconds (negative: expired).
pub fn token(sub: &str, lifetime: i64) -> String {
    token_with_claims(&[("sub", sub)], lifetime)
}

/// A token with text `claims` besides the audience and times.
pub fn token_with_claims(claims: &[(&str, &str)], lifetime: i64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    let mut body = json!({"aud": AUDIENCE, "iat": now, "exp": now + lifetime});
    for (claim, value) in claims {
        body[*claim] = json!(value);
    }
    jsonwebtoken::encode(
        &header,
        &body,
        &jsonwebtoken::EncodingKey::from_secret(SECRET),
    )
    .unwrap()
}

/// Posts `body` to `/sync/stream` over raw HTTP/1.1; returns the status, the content type
/// and the reader positioned at the body.
pub fn post_sync_stream(
    port: u16,
    token: Option<&str>,
    accept: &str,
    extra_headers: &str,
    body: &str,
) -> (u16, String, BufReader<TcpStream>) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Patience::of_run().stall))
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Token {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "POST /sync/stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Accept: {accept}\r\n\
         {extra_headers}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line[9..12].parse().unwrap();
    let mut content_type = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-type: ") {
            content_type = v.trim().to_owned();
        }
    }
    (status, content_type, reader)
}
