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
         port: !env PS_PORT\nstorage:\n  type: mongodb\nfancy: 1\n",
    )
    .unwrap();
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
        vec!["fancy (unknown)".to_owned(), "storage".to_owned()]
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

#[test]
fn errors_name_the_key_and_the_fix() {
    let rules = "sync_config:\n  content: x\n";
    let conn = "replication:\n  connections:\n    - uri: postgresql://u@h/db\n";
    let cases: &[(String, &str)] = &[
        (String::new(), "PSM_C1003"),
        ("[1, 2]".into(), "PSM_C1003"),
        ("port: [\n".into(), "PSM_C1003"),
        (rules.into(), "replication.connections[0]"),
        (format!("{rules}replication:\n  connections: []\n"), "the list is empty"),
        (conn.into(), "sync_config"),
        (format!("{conn}sync_config: {{}}\n"), "neither `path` nor `content`"),
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
        (
            format!("{rules}replication:\n  connections:\n    - {{uri: 'postgresql://u@h/d'}}\n    - {{uri: 'postgresql://u@h/e'}}\n"),
            "only one source connection",
        ),
        (
            format!("{rules}replication:\n  connections:\n    - {{hostname: h, database: d}}\n"),
            "no user name",
        ),
    ];
    for (text, expected) in cases {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(expected), "for {text:?}: {err}");
        assert!(err.starts_with("PSM_C"), "{err}");
    }
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
