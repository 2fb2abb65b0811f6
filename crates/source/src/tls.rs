//! rustls client configuration from `sslmode` and `cacert`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, DigitallySignedStruct, Error as TlsError, RootCertStore, SignatureScheme,
};

use super::SourceError;
use config::{SourceConnection, SslMode};

/// Installs aws-lc-rs as the process's rustls provider (pg_walstream's default backend),
/// once; later calls do nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The TLS configuration for `conn`, or `None` when TLS is off (`disable`, Unix socket).
pub(super) fn client_config(conn: &SourceConnection) -> Result<Option<ClientConfig>, SourceError> {
    if conn.sslmode == SslMode::Disable || conn.is_unix_socket() {
        return Ok(None);
    }
    install_crypto_provider();
    let roots = Arc::new(root_store(conn.cacert.as_deref())?);
    let webpki = WebPkiServerVerifier::builder(roots)
        .build()
        .map_err(|e| SourceError::Tls(format!("cannot build the certificate verifier: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match conn.sslmode {
        SslMode::VerifyCa => Arc::new(ChainOnly(webpki)),
        _ => webpki,
    };
    let config = ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(config))
}

/// A file holding `cacert` for libraries that want a path (`pg_walstream`'s
/// `sslrootcert`): the path itself, or — for PEM text inline in the config — a private
/// file (mode 0600) in the temporary directory named after the text's hash.
pub(crate) fn cacert_file(cacert: &str) -> Result<String, SourceError> {
    if !cacert.trim_start().starts_with("-----BEGIN") {
        return Ok(cacert.to_owned());
    }
    use sha2::Digest;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let digest = sha2::Sha256::digest(cacert.as_bytes());
    let name: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    let path = std::env::temp_dir().join(format!(
        "powersync_mdbx-{}-ca-{name}.pem",
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    ));
    if std::fs::read(&path).is_ok_and(|existing| existing == cacert.as_bytes()) {
        return Ok(path.display().to_string());
    }
    let failed = |e: std::io::Error| {
        SourceError::Tls(format!(
            "cannot write the inline cacert to {}: {e}",
            path.display()
        ))
    };
    let partial = path.with_extension(format!("{}.tmp", std::process::id()));
    // A fresh file only (never through a link someone else left in the shared directory);
    // the rename then replaces whatever `path` was.
    let _ = std::fs::remove_file(&partial);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(failed)?;
    file.write_all(cacert.as_bytes()).map_err(failed)?;
    std::fs::rename(&partial, &path).map_err(failed)?;
    Ok(path.display().to_string())
}

/// Roots from `cacert` (a PEM file path, or PEM text inline), else the public web roots.
fn root_store(cacert: Option<&str>) -> Result<RootCertStore, SourceError> {
    let mut store = RootCertStore::empty();
    let Some(cacert) = cacert else {
        store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        return Ok(store);
    };
    let pem = if cacert.trim_start().starts_with("-----BEGIN") {
        cacert.as_bytes().to_vec()
    } else {
        std::fs::read(cacert)
            .map_err(|e| SourceError::Tls(format!("cannot read cacert {cacert}: {e}")))?
    };
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| SourceError::Tls(format!("cacert is not valid PEM: {e}")))?;
        store
            .add(cert)
            .map_err(|e| SourceError::Tls(format!("cacert holds an unusable certificate: {e}")))?;
    }
    if store.is_empty() {
        return Err(SourceError::Tls("cacert holds no certificate".into()));
    }
    Ok(store)
}

/// `verify-ca`: the chain must lead to a trusted root; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(TlsError::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
