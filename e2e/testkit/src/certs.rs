//! Throwaway certificate authorities and server certificates for TLS tests, made with the
//! `openssl` command (2048-bit RSA keys, valid for two days).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA: its certificate (give it as `cacert`) and key, in a directory of the test.
pub struct TestCa {
    /// PEM certificate of the CA.
    pub cert: PathBuf,
    key: PathBuf,
    dir: PathBuf,
    name: String,
}

/// A server certificate and its key, the key readable only by the cluster user.
pub struct ServerCert {
    /// PEM certificate (signed by the CA).
    pub cert: PathBuf,
    /// PEM private key, mode 0600, owned by the cluster user.
    pub key: PathBuf,
}

impl ServerCert {
    /// `postgresql.conf` lines that turn TLS on with this certificate.
    pub fn ssl_conf(&self) -> Vec<String> {
        vec![
            "ssl = on".to_owned(),
            format!("ssl_cert_file = '{}'", self.cert.display()),
            format!("ssl_key_file = '{}'", self.key.display()),
        ]
    }
}

impl TestCa {
    /// Creates a CA called `name` (its files are `name.crt`, `name.key` in `dir`).
    pub fn new(dir: &Path, name: &str) -> Self {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        openssl(
            Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                ])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert)
                .args(["-subj", &format!("/CN={name}")])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]),
        );
        Self {
            cert,
            key,
            dir: dir.to_owned(),
            name: name.to_owned(),
        }
    }

    /// Issues a server certificate `file_name.crt` for `sans` (`DNS:localhost`,
    /// `IP:127.0.0.1`), its key owned by `owner` (the cluster user) when given.
    pub fn issue_server(&self, file_name: &str, sans: &[&str], owner: Option<&str>) -> ServerCert {
        let cert = self.dir.join(format!("{file_name}.crt"));
        let key = self.dir.join(format!("{file_name}.key"));
        let csr = self.dir.join(format!("{file_name}.csr"));
        let ext = self.dir.join(format!("{file_name}.ext"));
        let common_name = sans
            .first()
            .and_then(|s| s.split_once(':'))
            .map_or("server", |(_, v)| v);
        openssl(
            Command::new("openssl")
                .args(["req", "-newkey", "rsa:2048", "-nodes"])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&csr)
                .args(["-subj", &format!("/CN={common_name}")]),
        );
        std::fs::write(
            &ext,
            format!(
                "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\n\
                 extendedKeyUsage = serverAuth\nsubjectAltName = {}\n",
                sans.join(", ")
            ),
        )
        .expect("write extensions file");
        openssl(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-in"])
                .arg(&csr)
                .arg("-CA")
                .arg(&self.cert)
                .arg("-CAkey")
                .arg(&self.key)
                .args(["-set_serial", &serial(&self.name, file_name)])
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(&cert),
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::set_permissions(&cert, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        if let Some(user) = owner {
            let status = Command::new("chown")
                .arg(user)
                .arg(&key)
                .status()
                .expect("chown runs");
            assert!(status.success(), "chown {user} {}", key.display());
        }
        ServerCert { cert, key }
    }

    /// The CA certificate as PEM text.
    pub fn pem(&self) -> String {
        std::fs::read_to_string(&self.cert).expect("read CA certificate")
    }
}

fn serial(ca: &str, name: &str) -> String {
    let mut h: u64 = 1469598103934665603;
    for b in ca.bytes().chain(name.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(1099511628211);
    }
    (h >> 2).to_string()
}

fn openssl(cmd: &mut Command) {
    let out = cmd.output().expect("the openssl command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
