//! One HTTP/1.1 GET of a JWKS document over `http` or `https`, with a deadline and a size cap.
//! No redirects, no connection reuse: a fetch happens at most every few minutes.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{header, Request, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::address::AddressPolicy;

/// Where to fetch from, checked once at startup.
#[derive(Debug, Clone)]
pub(crate) struct FetchTarget {
    uri: Uri,
    host: String,
    port: u16,
    tls: Option<Arc<rustls::ClientConfig>>,
    addresses: Arc<AddressPolicy>,
}

impl FetchTarget {
    /// Parses `uri`; `https` verifies the server against the public web roots; plain
    /// `http` only for a loopback host, or anywhere with `allow_http`. A host that is an
    /// address `addresses` refuses is refused here; a name, when it is resolved.
    pub(crate) fn parse(
        uri: &str,
        allow_http: bool,
        addresses: Arc<AddressPolicy>,
    ) -> Result<Self, String> {
        let parsed: Uri = uri
            .parse()
            .map_err(|e| format!("not a URL ({e}); write http://host/path or https://host/path"))?;
        let tls = match parsed.scheme_str() {
            Some("http") => None,
            Some("https") => Some(Arc::new(tls_config()?)),
            _ => return Err("the scheme must be http or https".to_owned()),
        };
        let host = parsed
            .host()
            .filter(|h| !h.is_empty())
            .ok_or("the URL has no host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if tls.is_none() && !allow_http && !is_loopback(&host) {
            return Err(format!(
                "plain http is refused for host {host}: keys fetched in clear can be replaced \
                 on the way; use https, or set client_auth.jwks_allow_http: true for a \
                 network you trust"
            ));
        }
        if let Ok(ip) = host.parse::<std::net::IpAddr>() {
            addresses.check(ip)?;
        }
        let port = parsed
            .port_u16()
            .unwrap_or(if tls.is_some() { 443 } else { 80 });
        Ok(Self {
            uri: parsed,
            host,
            port,
            tls,
            addresses,
        })
    }

    /// GETs the document; `Err` says why in words for the operator.
    pub(crate) async fn get(&self, timeout: Duration, max_bytes: usize) -> Result<Bytes, String> {
        match tokio::time::timeout(timeout, self.get_unbounded(max_bytes)).await {
            Ok(result) => result,
            Err(_) => Err(format!("no complete answer within {timeout:?}")),
        }
    }

    async fn get_unbounded(&self, max_bytes: usize) -> Result<Bytes, String> {
        let tcp = if self.addresses.is_open() {
            TcpStream::connect((self.host.as_str(), self.port)).await
        } else {
            // The first address, checked, and then connected to: a second resolution could
            // answer otherwise.
            let address = tokio::net::lookup_host((self.host.as_str(), self.port))
                .await
                .map_err(|e| format!("cannot resolve {}: {e}", self.host))?
                .next()
                .ok_or_else(|| format!("{} resolves to no address", self.host))?;
            self.addresses.check(address.ip()).map_err(|refused| {
                format!("PSYNC_S2203 refused to fetch from {}: {refused}", self.host)
            })?;
            TcpStream::connect(address).await
        }
        .map_err(|e| format!("cannot connect: {e}"))?;
        let path = self
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let authority = self
            .uri
            .authority()
            .map_or(self.host.as_str(), |a| a.as_str())
            .to_owned();
        let request = Request::get(path)
            .header(header::HOST, authority)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, "powersync-mdbx")
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("cannot build the request: {e}"))?;
        match &self.tls {
            None => exchange(tcp, request, max_bytes).await,
            Some(config) => {
                let name = ServerName::try_from(self.host.clone())
                    .map_err(|e| format!("invalid TLS server name: {e}"))?;
                let tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS handshake failed: {e}"))?;
                exchange(tls, request, max_bytes).await
            }
        }
    }
}

/// Sends `request` on a fresh connection and reads the body, at most `max_bytes`.
async fn exchange<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
    max_bytes: usize,
) -> Result<Bytes, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    let response = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the server answered HTTP {status}"));
        }
        let body = Limited::new(response.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    format!("the answer is larger than {max_bytes} bytes")
                } else {
                    format!("reading the answer failed: {e}")
                }
            })?;
        Ok(body.to_bytes())
        // `sender` drops here, so the connection below finishes.
    };
    let (result, _) = futures_util::future::join(response, connection).await;
    result
}

fn tls_config() -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// `localhost` or a loopback address.
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> Arc<AddressPolicy> {
        Arc::new(AddressPolicy::default())
    }

    fn refusing(ranges: &[&str]) -> Arc<AddressPolicy> {
        let ranges: Vec<String> = ranges.iter().map(|r| (*r).to_owned()).collect();
        Arc::new(AddressPolicy::new(&ranges, false).unwrap())
    }

    #[tokio::test]
    async fn refused_addresses_are_refused_before_connecting() {
        // An address in the URL: at parse time.
        let error =
            FetchTarget::parse("http://127.0.0.1:9/k", false, refusing(&["local"])).unwrap_err();
        assert!(error.contains("not a public unicast"), "{error}");
        // A name: once resolved, before any connection (nothing listens on port 9).
        let target =
            FetchTarget::parse("http://localhost:9/k", false, refusing(&["127.0.0.0/8"])).unwrap();
        let error = target.get(Duration::from_secs(5), 1024).await.unwrap_err();
        assert!(
            error.contains("PSYNC_S2203") && error.contains("jwks_reject_ip_ranges"),
            "{error}"
        );
    }

    #[test]
    fn parses_targets() {
        let t = FetchTarget::parse("http://127.0.0.1:8080/keys?x=1", false, open()).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 8080));
        assert!(t.tls.is_none());
        let t =
            FetchTarget::parse("https://example.com/.well-known/jwks.json", false, open()).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("example.com", 443));
        assert!(t.tls.is_some());
        let t = FetchTarget::parse("http://[::1]/k", false, open()).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 80));
        for bad in ["ftp://x/y", "/relative", "not a url", "http:///path"] {
            assert!(FetchTarget::parse(bad, true, open()).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_http_only_for_loopback_unless_allowed() {
        for ok in [
            "http://127.0.0.1/k",
            "http://[::1]/k",
            "http://localhost:8080/k",
        ] {
            assert!(FetchTarget::parse(ok, false, open()).is_ok(), "{ok}");
        }
        let refused =
            FetchTarget::parse("http://auth.example.com/keys", false, open()).unwrap_err();
        assert!(refused.contains("plain http is refused"), "{refused}");
        assert!(refused.contains("jwks_allow_http"), "{refused}");
        assert!(FetchTarget::parse("http://auth.example.com/keys", true, open()).is_ok());
        assert!(FetchTarget::parse("https://auth.example.com/keys", false, open()).is_ok());
    }

    #[tokio::test]
    async fn refused_connection_is_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let t = FetchTarget::parse(&format!("http://127.0.0.1:{port}/"), false, open()).unwrap();
        let err = t.get(Duration::from_secs(5), 1024).await.unwrap_err();
        assert!(err.contains("cannot connect"), "{err}");
    }
}
