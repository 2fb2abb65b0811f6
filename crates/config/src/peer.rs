//! The fleet settings of a sync replica (`powersync_mdbx.peer_secret`,
//! `powersync_mdbx.seed_from`): the secret peers prove to each other, and the peer an empty
//! replica copies its store from instead of taking a snapshot.

use std::net::IpAddr;

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

    /// Refuses a secret shorter than [`Self::MIN_BYTES`].
    pub fn check(&self) -> Result<(), String> {
        if self.0.len() < Self::MIN_BYTES {
            return Err(format!(
                "powersync_mdbx.peer_secret is {} bytes long; use at least {} random bytes \
                 (e.g. the output of `openssl rand -hex 32`), the same on every replica",
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

/// The peer a replica seeds from: `http://<loopback address>:<port>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedPeer {
    /// The peer's address.
    pub ip: IpAddr,
    /// The peer's sync port.
    pub port: u16,
}

impl SeedPeer {
    /// Parses `powersync_mdbx.seed_from`. This build copies stores only between replicas
    /// on one host (loopback, plain HTTP): a store copied over a network must be
    /// encrypted, and the peer endpoint does not serve TLS yet.
    pub fn parse(url: &str) -> Result<Self, String> {
        let fix = "set powersync_mdbx.seed_from to http://127.0.0.1:<port of the peer's sync \
                   server>";
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            if url.starts_with("https://") {
                format!(
                    "powersync_mdbx.seed_from is {url}: this build copies stores only between \
                     replicas on one host (loopback); {fix}"
                )
            } else {
                format!("powersync_mdbx.seed_from is {url}, not an http:// URL; {fix}")
            }
        })?;
        let rest = rest.trim_end_matches('/');
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("powersync_mdbx.seed_from is {url}, without a port; {fix}"))?;
        let ip: IpAddr = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| {
                format!("powersync_mdbx.seed_from is {url}: the host must be an IP address; {fix}")
            })?;
        if !ip.is_loopback() {
            return Err(format!(
                "powersync_mdbx.seed_from is {url}: this build copies stores only between \
                 replicas on one host, since the store must not cross a network in clear and \
                 the peer endpoint does not serve TLS yet; {fix}"
            ));
        }
        let port = port
            .parse()
            .map_err(|_| format!("powersync_mdbx.seed_from is {url}: bad port; {fix}"))?;
        Ok(Self { ip, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_peers_are_loopback_http_addresses() {
        let peer = SeedPeer::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            (peer.ip.to_string().as_str(), peer.port),
            ("127.0.0.1", 8080)
        );
        assert!(SeedPeer::parse("http://[::1]:9000")
            .unwrap()
            .ip
            .is_loopback());
        for (url, says) in [
            (
                "https://127.0.0.1:8080",
                "only between replicas on one host",
            ),
            ("http://10.0.0.5:8080", "must not cross a network in clear"),
            ("http://peer.local:8080", "must be an IP address"),
            ("127.0.0.1:8080", "not an http:// URL"),
            ("http://127.0.0.1", "without a port"),
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
}
