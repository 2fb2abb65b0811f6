//! rustls client configuration from `sslmode` and `cacert`.

use std::path::{Path, PathBuf};
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
/// `sslrootcert`): the path itself, or — for PEM text inline in the config — a file (mode
/// 0600) named after the text's hash in this user's private directory under the
/// temporary directory.
pub(crate) fn cacert_file(cacert: &str) -> Result<String, SourceError> {
    cacert_file_in(&std::env::temp_dir(), cacert)
}

/// [`cacert_file`] under `base`.
fn cacert_file_in(base: &Path, cacert: &str) -> Result<String, SourceError> {
    if !cacert.trim_start().starts_with("-----BEGIN") {
        return Ok(cacert.to_owned());
    }
    use sha2::Digest;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = private_dir(base)?;
    let digest = sha2::Sha256::digest(cacert.as_bytes());
    let name: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("ca-{name}.pem"));
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

/// This user's directory under `base` (shared, like /tmp): created 0700, and refused
/// unless it is a real directory owned by this user that no one else may enter, so no
/// other user can place or swap the CA file the connection will trust.
fn private_dir(base: &Path) -> Result<PathBuf, SourceError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = base.join(format!("powersync_mdbx-{uid}"));
    let refuse = |why: String| {
        SourceError::Tls(format!(
            "cannot keep the inline cacert in {}: {why}; remove it, or give cacert as a file \
             path",
            dir.display()
        ))
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refuse(e.to_string())),
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    if meta.uid() != uid {
        return Err(refuse(format!("it belongs to user id {}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "others may use it (mode {:o})",
            meta.mode() & 0o777
        )));
    }
    Ok(dir)
}

/// Roots from `cacert` (a PEM file path, or PEM text inline), else the public web roots.
pub fn root_store(cacert: Option<&str>) -> Result<RootCertStore, SourceError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn inline_pem_goes_to_a_private_file_in_a_private_directory() {
        let base = tempfile::tempdir().unwrap();
        let path = cacert_file_in(base.path(), PEM).unwrap();
        let file = std::fs::metadata(&path).unwrap();
        assert_eq!(file.permissions().mode() & 0o777, 0o600);
        let dir = std::fs::metadata(Path::new(&path).parent().unwrap()).unwrap();
        assert_eq!(dir.permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), PEM);
        assert_eq!(cacert_file_in(base.path(), PEM).unwrap(), path);
        assert_eq!(
            cacert_file_in(base.path(), "/etc/ca.pem").unwrap(),
            "/etc/ca.pem"
        );
    }

    #[test]
    fn a_directory_others_may_use_or_a_link_is_refused() {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join(format!("powersync_mdbx-{uid}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = cacert_file_in(base.path(), PEM).unwrap_err().to_string();
        assert!(err.contains("others may use it"), "{err}");

        let base = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            elsewhere.path(),
            base.path().join(format!("powersync_mdbx-{uid}")),
        )
        .unwrap();
        let err = cacert_file_in(base.path(), PEM).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
    }
}
