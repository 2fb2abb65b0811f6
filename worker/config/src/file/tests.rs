//! Table-driven tests for the configuration file.
use super::*;

fn parse(text: &str) -> Result<ServiceConfig, ConfigError> {
    let env = |name: &str| match name {
        "PS_URI" => Some("postgresql://repl:secret@db:5433/app?sslmode=verify-ca".to_owned()),
        "PS_PORT" => Some("8181".to_owned()),
        _ => None,
    };
    ServiceConfig::parse(Path::new("/etc/powersync/config.yaml"), text, &env)
}

#[test]
fn official_style_file_with_env_tags() {
    let cfg = parse(
        "replication:\n  connections:\n    - type: postgresql\n      uri: !env PS_URI\n\
         sync_config:\n  content: |\n    bucket_definitions: {}\n\
         client_auth:\n  jwks_uri: https://auth.example/keys\n  audience: [app]\n\
         port: !env PS_PORT\nstorage:\n  type: mongodb\nfancy: 1\n_type: self-hosted\n\
         api:\n  tokens: [admin-token]\n",
    )
    .unwrap();
    assert_eq!(cfg.api_tokens.expose(), ["admin-token"]);
    assert_eq!(cfg.source.host, "db");
    assert_eq!(cfg.source.port, 5433);
    assert_eq!(cfg.source.sslmode, SslMode::VerifyCa);
    assert_eq!(cfg.port, 8181);
    assert_eq!(cfg.rules.path, None);
    assert!(cfg.rules.content.contains("bucket_definitions"));
    assert_eq!(cfg.client_auth.jwks_uri, vec!["https://auth.example/keys"]);
    assert_eq!(cfg.client_auth.audience, vec!["app"]);
    assert_eq!(
        cfg.ignored,
        vec![
            "_type".to_owned(),
            "fancy (unknown)".to_owned(),
            "storage".to_owned()
        ]
    );
}

#[test]
fn separate_fields_and_inline_jwks() {
    let cfg = parse(
        "replication:\n  connections:\n    - hostname: 127.0.0.1\n      port: 5999\n\
         \x20     database: app\n      username: repl\n      password: pw\n      sslmode: disable\n\
         sync_rules:\n  content: 'bucket_definitions: {}'\n\
         client_auth:\n  jwks:\n    keys:\n      - {kty: oct, k: c2VjcmV0, alg: HS256}\n\
         \x20 audience: one\n  issuer: https://issuer\n",
    )
    .unwrap();
    assert_eq!(cfg.source.port, 5999);
    assert_eq!(cfg.source.password.as_deref(), Some("pw"));
    assert_eq!(cfg.source.sslmode, SslMode::Disable);
    assert_eq!(cfg.port, DEFAULT_PORT);
    assert_eq!(cfg.client_auth.jwks_keys.len(), 1);
    assert_eq!(cfg.client_auth.issuer.as_deref(), Some("https://issuer"));
}

/// Each case's error names what to fix (`expected`) and carries a PSM_C code.
fn assert_errors(cases: &[(String, &str)]) {
    for (text, expected) in cases {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(expected), "for {text:?}: {err}");
        assert!(err.starts_with("PSM_C"), "{err}");
    }
}

#[test]
fn errors_name_the_key_and_the_fix_for_syntax() {
    let cases: &[(String, &str)] = &[
        (String::new(), "PSM_C1003"),
        ("[1, 2]".into(), "PSM_C1003"),
        ("port: [\n".into(), "PSM_C1003"),
    ];
    assert_errors(cases);
}

#[test]
fn errors_name_the_key_and_the_fix_for_missing_sections() {
    let rules = "sync_config:\n  content: x\n";
    let conn = "replication:\n  connections:\n    - uri: postgresql://u@h/db\n";
    let cases: &[(String, &str)] = &[
        (rules.into(), "replication.connections[0]"),
        (
            format!("{rules}replication:\n  connections: []\n"),
            "the list is empty",
        ),
        (conn.into(), "sync_config"),
        (
            format!("{conn}sync_config: {{}}\n"),
            "neither `path` nor `content`",
        ),
    ];
    assert_errors(cases);
}

/// Two source connections, in flow style.
const TWO_CONNECTIONS: &str =
    "replication:\n  connections:\n    - {uri: 'postgresql://u@h/d'}\n    - {uri: 'postgresql://u@h/e'}\n";

#[test]
fn errors_name_the_key_and_the_fix_for_values() {
    let rules = "sync_config:\n  content: x\n";
    let conn = "replication:\n  connections:\n    - uri: postgresql://u@h/db\n";
    let cases: &[(String, &str)] = &[
        (format!("{conn}{rules}port: 70000\n"), "`port`"),
        (format!("{conn}{rules}port: !env NOPE\n"), "!env NOPE"),
        (
            format!("{rules}replication:\n  connections:\n    - uri: postgresql://u@h/db?sslmode=prefer\n"),
            "encrypts without verifying",
        ),
        (
            format!("{rules}replication:\n  connections:\n    - type: mysql\n      uri: x\n"),
            "use `postgresql`",
        ),
        (format!("{rules}{TWO_CONNECTIONS}"), "only one source connection"),
        (
            format!("{rules}replication:\n  connections:\n    - {{hostname: h, database: d}}\n"),
            "no user name",
        ),
    ];
    assert_errors(cases);
}

#[test]
fn rules_path_is_relative_to_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), "bucket_definitions: {}\n").unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "replication:\n  connections:\n    - uri: postgresql://u@localhost/db?sslmode=disable\n\
         sync_config:\n  path: rules.yaml\n",
    )
    .unwrap();
    let cfg = ServiceConfig::load(&config).unwrap();
    assert_eq!(cfg.rules.path, Some(dir.path().join("rules.yaml")));
    assert_eq!(cfg.rules.content, "bucket_definitions: {}\n");

    std::fs::remove_file(dir.path().join("rules.yaml")).unwrap();
    let err = ServiceConfig::load(&config).unwrap_err().to_string();
    assert!(
        err.starts_with("PSM_C1002") && err.contains("rules.yaml"),
        "{err}"
    );
    let err = ServiceConfig::load(&dir.path().join("absent.yaml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("absent.yaml"), "{err}");
}

/// `e2e/fixture/official-config.yaml`: every key of the official service's file.
const OFFICIAL_FILE: &str = include_str!("../../../../e2e/fixture/official-config.yaml");
/// Its keys that would change security behaviour and that this engine does not support.
const REFUSED: [&str; 4] = [
    "client_certificate",
    "client_private_key",
    "tls_servername",
    "reject_ip_ranges",
];

/// The official file without the lines of `keys`.
fn official_without(keys: &[&str]) -> String {
    OFFICIAL_FILE
        .lines()
        .filter(|line| {
            let line = line.trim_start();
            !keys.iter().any(|k| line.starts_with(&format!("{k}:")))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn load_official(text: &str) -> Result<ServiceConfig, ConfigError> {
    let env = |name: &str| match name {
        "PS_DATABASE_PASSWORD" => Some("pw".to_owned()),
        "PS_SUPABASE_JWT_SECRET" => Some("a-legacy-supabase-secret-of-enough-bytes".to_owned()),
        _ => None,
    };
    ServiceConfig::parse(Path::new("/etc/powersync/powersync.yaml"), text, &env)
}

#[test]
fn every_key_of_the_official_file_is_used_listed_or_refused() {
    for key in REFUSED {
        let others: Vec<&str> = REFUSED.iter().copied().filter(|k| *k != key).collect();
        let error = load_official(&official_without(&others)).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains(&format!("replication.connections[0].{key}")) && text.contains("PSM_C"),
            "{text}"
        );
    }
    let config = load_official(&official_without(&REFUSED)).unwrap();
    assert_eq!(
        config.ignored,
        [
            "api.parameters.bucket_count_cache_ttl_minutes",
            "api.parameters.checkpoint_request_retention_minutes",
            "api.parameters.max_data_fetch_concurrency",
            "healthcheck",
            "metadata",
            "migrations",
            "parameters",
            "replication.connections[0].connect_timeout",
            "replication.connections[0].debug_api",
            "replication.connections[0].heartbeat_interval_seconds",
            "replication.connections[0].id",
            "replication.connections[0].max_pool_size",
            "replication.connections[0].slot_name_prefix",
            "replication.connections[0].snapshot_socket_timeout",
            "replication.connections[0].tag",
            "storage",
            "sync_config.exit_on_error",
            "system.logging.format",
            "system.logging.level",
            "telemetry.disable_telemetry_sharing",
            "telemetry.internal_service_endpoint",
        ]
    );
    let auth = &config.client_auth;
    assert_eq!(auth.audience, ["powersync", "authenticated"]);
    assert_eq!(auth.jwks_keys.len(), 1);
    assert_eq!(
        auth.supabase,
        Some(Supabase {
            jwks_uri: Some(
                "https://abcdefghijklmnop.supabase.co/auth/v1/.well-known/jwks.json".to_owned()
            ),
            jwt_secret: Some("a-legacy-supabase-secret-of-enough-bytes".to_owned()),
        })
    );
    assert_eq!(
        auth.jwks_reject_ip_ranges,
        ["10.0.0.0/8", "fd00::/8", "local"]
    );
    assert!(auth.jwks_reject_ipv6);
}

#[test]
fn unknown_keys_are_listed_wherever_they_are() {
    let config = parse(
        "replication:\n  connections:\n    - uri: postgresql://u@h/db\n      colour: blue\n\
         sync_config:\n  content: x\n  flavour: 1\n\
         client_auth:\n  audience: [a]\n  supabase_jwt_secret: s\n  jwks:\n    keys: []\n    extra: 1\n\
         api:\n  parameters:\n    speed: 3\nfancy: 1\n",
    )
    .unwrap();
    assert_eq!(
        config.ignored,
        [
            "api.parameters.speed (unknown)",
            "client_auth.jwks.extra (unknown)",
            "client_auth.supabase_jwt_secret (used only with supabase: true)",
            "fancy (unknown)",
            "replication.connections[0].colour (unknown)",
            "sync_config.flavour (unknown)",
        ]
    );
    assert_eq!(config.client_auth.supabase, None);
}

#[test]
fn supabase_keys_derive_from_the_connection_or_the_test_override() {
    let file = |host: &str| {
        format!(
            "replication:\n  connections:\n    - uri: postgresql://u@{host}/db\n\
             sync_config:\n  content: x\nclient_auth:\n  supabase: true\n"
        )
    };
    let jwks = |host: &str, env: &dyn Fn(&str) -> Option<String>| {
        ServiceConfig::parse(Path::new("/c.yaml"), &file(host), env)
            .unwrap()
            .client_auth
            .supabase
            .unwrap()
            .jwks_uri
    };
    let none = |_: &str| None;
    assert_eq!(
        jwks("db.proj_1.supabase.co", &none).as_deref(),
        Some("https://proj_1.supabase.co/auth/v1/.well-known/jwks.json")
    );
    assert_eq!(jwks("db.example.com", &none), None);
    assert_eq!(jwks("db..supabase.co", &none), None);
    let overridden = |name: &str| {
        (name == SUPABASE_JWKS_OVERRIDE_ENV).then(|| "http://127.0.0.1:9/jwks".to_owned())
    };
    assert_eq!(
        jwks("127.0.0.1", &overridden).as_deref(),
        Some("http://127.0.0.1:9/jwks")
    );
    let bad = parse(
        "replication:\n  connections:\n    - uri: postgresql://u@h/db\nsync_config:\n  content: x\n\
         client_auth:\n  jwks_reject_ip_ranges: [10.0.0.0/33]\n",
    )
    .unwrap_err();
    assert!(
        bad.to_string()
            .contains("client_auth.jwks_reject_ip_ranges"),
        "{bad}"
    );
}

#[test]
fn slot_failover_is_read_from_the_connection_and_off_by_default() {
    let file = |extra: &str| {
        format!(
            "replication:\n  connections:\n    - type: postgresql\n      uri: !env PS_URI\n{extra}\
             sync_config:\n  content: |\n    bucket_definitions: {{}}\n\
             client_auth:\n  jwks_uri: https://auth.example/keys\n  audience: [app]\n"
        )
    };
    assert!(!parse(&file("")).unwrap().source.slot_failover);
    let on = parse(&file("      slot_failover: true\n")).unwrap();
    assert!(on.source.slot_failover);
    assert!(on.ignored.is_empty(), "{:?}", on.ignored);
    let err = parse(&file("      slot_failover: sometimes\n")).unwrap_err();
    assert!(err.to_string().contains("slot_failover"), "{err}");
}
