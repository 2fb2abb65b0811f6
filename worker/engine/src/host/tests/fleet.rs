//! The fleet's settings: the secret read from a private file, the peer listener's needs.

use super::*;

#[test]
fn a_peer_listener_needs_its_secret_certificate_key_and_an_address() {
    let (dir, secret_file) = dir_with_secret();
    let with = |listen: &str, secret: bool, cert: bool| HostSettings {
        peer_listen: Some(listen.to_owned()),
        peer_secret_file: secret.then(|| secret_file.clone()),
        peer_tls: config::PeerTlsFiles {
            cert_file: cert.then(|| dir.path().join("peer.crt")),
            key_file: cert.then(|| dir.path().join("peer.key")),
            ca_file: None,
        },
        ..settings(dir.path())
    };
    for (settings, says) in [
        (
            with("0.0.0.0:8443", false, true),
            "powersync_mdbx.peer_secret_file is not set",
        ),
        (with("0.0.0.0:8443", true, false), "peer_tls_cert_file"),
        (with("0.0.0.0", true, true), "not <address>:<port>"),
    ] {
        setting_refused(settings, says);
    }
}

/// Starts a host with `settings`; it must wait with `PSM_C1007` saying `says`. Returns the
/// message.
fn setting_refused(settings: HostSettings, says: &str) -> String {
    let mut host = Host::new(settings, Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    let snap = host.status().snapshot();
    assert_eq!(snap.phase, Phase::ConfigError);
    let err = snap.last_error.unwrap();
    assert!(
        err.code == "PSM_C1007" && err.message.contains(says),
        "{}: {}",
        err.code,
        err.message
    );
    err.message
}

/// A directory with a configuration file and the fleet's secret in a private file.
fn dir_with_secret() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_config(&dir.path().join("config.yaml"), free_port());
    let secret = "a-fleet-secret-of-enough-bytes\n";
    let secret_file = private_file(dir.path(), "peer_secret", secret);
    (dir, secret_file)
}

/// `text` in `dir/name`, mode 0600.
fn private_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[test]
fn the_fleet_secret_is_read_from_a_private_file_and_never_from_a_setting() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, secret_file) = dir_with_secret();
    let short_file = private_file(dir.path(), "short_secret", "short\n");
    let open_file = private_file(dir.path(), "open_secret", "a-fleet-secret-of-enough-bytes");
    std::fs::set_permissions(&open_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let with = |file: &Path, in_setting: bool| HostSettings {
        peer_secret_file: Some(file.to_owned()),
        peer_secret_in_setting: in_setting,
        ..settings(dir.path())
    };
    for (settings, says) in [
        (with(&secret_file, true), "remove it from postgresql.conf"),
        (with(&short_file, false), "at least 16"),
        (with(&open_file, false), "chmod 600"),
        (with(&dir.path().join("missing"), false), "cannot be read"),
    ] {
        let message = setting_refused(settings, says);
        assert!(!message.contains("a-fleet-secret"), "{message}");
    }
}
