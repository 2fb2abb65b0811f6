//! The fleet settings of a sync replica (`powersync_mdbx.peer_secret_file`,
//! `powersync_mdbx.seed_from`): the secret peers prove to each other, and the peer an empty
//! replica copies its store from instead of taking a snapshot.

use std::net::IpAddr;
use std::path::Path;

/// The shared secret of a fleet's replicas. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerSecret(String);

impl PeerSecret {
    /// Fewer bytes than this are refused: the secret guards a copy of every replicated row.
    pub const MIN_BYTES: usize = 16;

    /// The secret as configured (see [`Self::check`]).
    pub fn new(secret: String) -> Self {
        Self(secret)
    }

    /// The secret in `path` (`powersync_mdbx.peer_secret_file`), without trailing line
    /// ends and spaces. The file must be a regular file that neither its group nor others
    /// may read or write: a setting would be readable by every member of
    /// `pg_read_all_settings` (and so `pg_monitor`), and the secret opens a copy of every
    /// replicated row.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let metadata = std::fs::metadata(path).map_err(|e| {
            format!(
                "powersync_mdbx.peer_secret_file {shown} cannot be read: {e}; write the \
                 fleet's secret into it (e.g. `openssl rand -hex 32 > {shown}`), owned by the \
                 PostgreSQL server's user with mode 0600"
            )
        })?;
        if !metadata.is_file() {
            return Err(format!(
                "powersync_mdbx.peer_secret_file {shown} is not a regular file; point it at \
                 a file holding the fleet's secret"
            ));
        }
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "powersync_mdbx.peer_secret_file {shown} has mode {mode:04o}, so users other \
                 than the PostgreSQL server's can read or change it; run `chmod 600 {shown}`"
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "powersync_mdbx.peer_secret_file {shown} cannot be read: {e}; it must be \
                 UTF-8 text readable by the PostgreSQL server's user"
            )
        })?;
        Ok(Self(text.trim_end().to_owned()))
    }

    /// Refuses a secret shorter than [`Self::MIN_BYTES`].
    pub fn check(&self) -> Result<(), String> {
        if self.0.len() < Self::MIN_BYTES {
            return Err(format!(
                "the secret in powersync_mdbx.peer_secret_file is {} bytes long; use at \
                 least {} random bytes (e.g. the output of `openssl rand -hex 32`), the same \
                 on every replica",
                self.0.len(),
                Self::MIN_BYTES
            ));
        }
        Ok(())
    }

    /// The secret's bytes.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for PeerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerSecret(<redacted>)")
    }
}

/// The peer a replica seeds from: `https://<host>:<port>` (the peer's TLS peer
/// listener, `powersync_mdbx.peer_listen`), or `http://<loopback address>:<port>` (its
/// sync server, on this host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedPeer {
    /// The peer's host: an IP address, or (https) a name its certificate carries.
    pub host: String,
    /// The peer's port.
    pub port: u16,
    /// Over TLS (`https://`).
    pub tls: bool,
}

impl SeedPeer {
    /// Parses `powersync_mdbx.seed_from`. A store crosses a network only encrypted:
    /// plain `http://` is accepted only for a loopback address.
    pub fn parse(url: &str) -> Result<Self, String> {
        let fix = "set powersync_mdbx.seed_from to https://<peer host>:<its \
                   powersync_mdbx.peer_listen port>, or http://127.0.0.1:<port of its sync \
                   server> for a peer on this host";
        let (tls, rest) = if let Some(rest) = url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!(
                "powersync_mdbx.seed_from is {url}, not an https:// or http:// URL; {fix}"
            ));
        };
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("powersync_mdbx.seed_from is {url}, without a port; {fix}"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = host.parse::<IpAddr>().ok();
        if host.is_empty() || host.contains(['/', '@', '?', '#']) {
            return Err(format!(
                "powersync_mdbx.seed_from is {url}: no host name or address; {fix}"
            ));
        }
        if !tls && !ip.is_some_and(|ip| ip.is_loopback()) {
            return Err(format!(
                "powersync_mdbx.seed_from is {url}: a store copy must not cross a network in \
                 clear, so plain http:// is only for a loopback address; {fix}"
            ));
        }
        let port = port
            .parse()
            .map_err(|_| format!("powersync_mdbx.seed_from is {url}: bad port; {fix}"))?;
        Ok(Self {
            host: host.to_owned(),
            port,
            tls,
        })
    }
}

impl std::fmt::Display for SeedPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// The files of a fleet's TLS between peers (`powersync_mdbx.peer_tls_*`): PEM paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// The certificate chain the peer listener presents.
    pub cert_file: Option<std::path::PathBuf>,
    /// Its private key.
    pub key_file: Option<std::path::PathBuf>,
    /// The CA certificates a replica trusts the peer it seeds from with.
    pub ca_file: Option<std::path::PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_peers_are_https_or_loopback_http() {
        let peer = SeedPeer::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            (peer.host.as_str(), peer.port, peer.tls),
            ("127.0.0.1", 8080, false)
        );
        assert_eq!(SeedPeer::parse("http://[::1]:9000").unwrap().host, "::1");
        let remote = SeedPeer::parse("https://replica-a.internal:8443").unwrap();
        assert_eq!(
            (remote.host.as_str(), remote.port, remote.tls),
            ("replica-a.internal", 8443, true)
        );
        assert_eq!(remote.to_string(), "https://replica-a.internal:8443");
        assert!(SeedPeer::parse("https://10.0.0.5:8443").unwrap().tls);
        for (url, says) in [
            ("http://10.0.0.5:8080", "must not cross a network in clear"),
            (
                "http://peer.local:8080",
                "must not cross a network in clear",
            ),
            ("127.0.0.1:8080", "not an https:// or http:// URL"),
            ("https://127.0.0.1", "without a port"),
            ("https://:8443", "no host"),
            ("https://a:b", "bad port"),
        ] {
            let error = SeedPeer::parse(url).unwrap_err();
            assert!(error.contains(says), "{url}: {error}");
        }
    }

    #[test]
    fn short_secrets_are_refused_and_none_is_printed() {
        let short = PeerSecret::new("short".into());
        assert!(short.check().unwrap_err().contains("at least 16"));
        let secret = PeerSecret::new("a-long-enough-secret".into());
        secret.check().unwrap();
        assert!(!format!("{secret:?}").contains("long"));
    }

    #[test]
    fn a_secret_file_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer_secret");
        std::fs::write(&path, "a-long-enough-secret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = PeerSecret::from_file(&path).unwrap_err();
        assert!(
            error.contains("mode 0644") && error.contains("chmod 600"),
            "{error}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let secret = PeerSecret::from_file(&path).unwrap();
        assert_eq!(secret.expose(), b"a-long-enough-secret");
        let missing = PeerSecret::from_file(&dir.path().join("none")).unwrap_err();
        assert!(missing.contains("cannot be read"), "{missing}");
        assert!(PeerSecret::from_file(dir.path())
            .unwrap_err()
            .contains("not a regular file"));
    }
}
