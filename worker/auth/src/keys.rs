//! Verification keys from JWKs, and which token algorithms each key may verify.
//!
//! A key is bound to its type (and curve) at load time, so a token can never pick how a key's
//! bytes are used: an RSA public key is never an HMAC secret (no algorithm confusion).

use base64::alphabet::URL_SAFE;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// JWK fields are base64url; a trailing `=` padding is tolerated.
const JWK_BASE64: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The token algorithms this server accepts (`docs/spec/protocol.md` §6). ES512 is absent: the JWT
/// crate has no P-521 support, so such tokens are refused as unsupported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenAlg {
    Hs256,
    Hs384,
    Hs512,
    Rs256,
    Rs384,
    Rs512,
    Es256,
    Es384,
    EdDsa,
}

impl TokenAlg {
    /// The algorithm for a JOSE `alg` name; `None` for `none` and everything unsupported.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "HS256" => Self::Hs256,
            "HS384" => Self::Hs384,
            "HS512" => Self::Hs512,
            "RS256" => Self::Rs256,
            "RS384" => Self::Rs384,
            "RS512" => Self::Rs512,
            "ES256" => Self::Es256,
            "ES384" => Self::Es384,
            "EdDSA" => Self::EdDsa,
            _ => return None,
        })
    }

    /// The JOSE name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Hs256 => "HS256",
            Self::Hs384 => "HS384",
            Self::Hs512 => "HS512",
            Self::Rs256 => "RS256",
            Self::Rs384 => "RS384",
            Self::Rs512 => "RS512",
            Self::Es256 => "ES256",
            Self::Es384 => "ES384",
            Self::EdDsa => "EdDSA",
        }
    }

    fn crate_alg(self) -> Algorithm {
        match self {
            Self::Hs256 => Algorithm::HS256,
            Self::Hs384 => Algorithm::HS384,
            Self::Hs512 => Algorithm::HS512,
            Self::Rs256 => Algorithm::RS256,
            Self::Rs384 => Algorithm::RS384,
            Self::Rs512 => Algorithm::RS512,
            Self::Es256 => Algorithm::ES256,
            Self::Es384 => Algorithm::ES384,
            Self::EdDsa => Algorithm::EdDSA,
        }
    }
}

/// What a key is, including the curve: an EC key verifies only its curve's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyType {
    Oct,
    Rsa,
    EcP256,
    EcP384,
    Ed25519,
}

impl KeyType {
    fn allows(self, alg: TokenAlg) -> bool {
        use TokenAlg::*;
        match self {
            Self::Oct => matches!(alg, Hs256 | Hs384 | Hs512),
            Self::Rsa => matches!(alg, Rs256 | Rs384 | Rs512),
            Self::EcP256 => alg == Es256,
            Self::EcP384 => alg == Es384,
            Self::Ed25519 => alg == EdDsa,
        }
    }
}

/// The shortest HMAC secret not warned about: as long as the SHA-256 output, the least
/// RFC 7518 (section 3.2) allows for HS256.
pub const MIN_HMAC_SECRET_BYTES: usize = 32;

/// Warnings about inline keys that verify but are weak: HMAC secrets shorter than
/// [`MIN_HMAC_SECRET_BYTES`] (a short shared secret can be guessed offline from one token).
pub fn weak_key_warnings(jwks: &[Value]) -> Vec<String> {
    jwks.iter()
        .enumerate()
        .filter(|(_, jwk)| jwk.get("kty").and_then(Value::as_str) == Some("oct"))
        .filter_map(|(index, jwk)| {
            let secret = JWK_BASE64.decode(jwk.get("k")?.as_str()?).ok()?;
            (secret.len() < MIN_HMAC_SECRET_BYTES).then(|| {
                let kid = jwk
                    .get("kid")
                    .and_then(Value::as_str)
                    .map(|k| format!(" (kid {})", super::error::shorten(k, 40)))
                    .unwrap_or_default();
                format!(
                    "client_auth.jwks.keys[{index}]{kid}: an HMAC secret of {} bytes; use at \
                     least {MIN_HMAC_SECRET_BYTES} random bytes, or an asymmetric key",
                    secret.len()
                )
            })
        })
        .collect()
}

/// One key that can verify token signatures.
#[derive(Clone)]
pub(crate) struct VerifyKey {
    kid: Option<String>,
    alg: Option<TokenAlg>,
    kind: KeyType,
    key: DecodingKey,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl VerifyKey {
    /// Parses a public JWK (`oct`, `RSA`, `EC` P-256/P-384, `OKP` Ed25519). The error says
    /// what is wrong with it.
    pub(crate) fn from_jwk(jwk: &Value) -> Result<Self, String> {
        let Some(fields) = jwk.as_object() else {
            return Err("a JWK must be a JSON object".to_owned());
        };
        let text = |name: &str| -> Result<Option<&str>, String> {
            match fields.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(format!("`{name}` must be a string")),
            }
        };
        let required = |name: &str| -> Result<&str, String> {
            text(name)?.ok_or_else(|| format!("`{name}` is missing"))
        };
        let bytes = |name: &str| -> Result<Vec<u8>, String> {
            JWK_BASE64
                .decode(required(name)?)
                .map_err(|_| format!("`{name}` is not base64url"))
        };
        let kty = required("kty")?;
        let kind = match kty {
            "oct" => {
                if bytes("k")?.is_empty() {
                    return Err("`k` is empty".to_owned());
                }
                KeyType::Oct
            }
            "RSA" => {
                let n = bytes("n")?;
                let bits = significant_bits(&n);
                if !(2048..=8192).contains(&bits) {
                    return Err(format!(
                        "the RSA modulus has {bits} bits; 2048 to 8192 bits are accepted"
                    ));
                }
                if bytes("e")?.is_empty() {
                    return Err("`e` is empty".to_owned());
                }
                KeyType::Rsa
            }
            "EC" => {
                let (kind, size) = match required("crv")? {
                    "P-256" => (KeyType::EcP256, 32),
                    "P-384" => (KeyType::EcP384, 48),
                    other => {
                        return Err(format!(
                            "EC curve `{}` is not supported; use P-256 or P-384",
                            super::error::shorten(other, 16)
                        ))
                    }
                };
                if bytes("x")?.len() != size || bytes("y")?.len() != size {
                    return Err(format!("`x` and `y` must be {size} bytes each"));
                }
                kind
            }
            "OKP" => {
                let crv = required("crv")?;
                if crv != "Ed25519" {
                    return Err(format!(
                        "OKP curve `{}` is not supported; use Ed25519",
                        super::error::shorten(crv, 16)
                    ));
                }
                if bytes("x")?.len() != 32 {
                    return Err("`x` must be 32 bytes".to_owned());
                }
                KeyType::Ed25519
            }
            other => {
                return Err(format!(
                    "key type `{}` is not supported; use oct, RSA, EC or OKP",
                    super::error::shorten(other, 16)
                ))
            }
        };
        let alg = match text("alg")? {
            None => None,
            Some(name) => {
                let Some(alg) = TokenAlg::parse(name) else {
                    return Err(format!(
                        "`alg` {} is not a supported signing algorithm",
                        super::error::shorten(name, 16)
                    ));
                };
                if !kind.allows(alg) {
                    return Err(format!("`alg` {name} does not fit this {kty} key"));
                }
                Some(alg)
            }
        };
        let key = match kind {
            KeyType::Oct => DecodingKey::from_secret(&bytes("k")?),
            KeyType::Rsa => DecodingKey::from_rsa_raw_components(&bytes("n")?, &bytes("e")?),
            KeyType::EcP256 | KeyType::EcP384 => {
                let mut point = vec![0x04];
                point.extend(bytes("x")?);
                point.extend(bytes("y")?);
                DecodingKey::from_ec_der(&point)
            }
            KeyType::Ed25519 => DecodingKey::from_ed_der(&bytes("x")?),
        };
        Ok(Self {
            kid: text("kid")?.map(str::to_owned),
            alg,
            kind,
            key,
        })
    }

    /// The key id, if the JWK has one; keys without one are tried for any matching token.
    pub(crate) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// Whether the key may verify `alg`: the JWK's `alg` if it has one, else its type.
    pub(crate) fn accepts(&self, alg: TokenAlg) -> bool {
        self.kind.allows(alg) && self.alg.is_none_or(|own| own == alg)
    }

    /// Whether `signature` (base64url) signs `message` under `alg` with this key.
    pub(crate) fn verifies(&self, alg: TokenAlg, message: &[u8], signature: &str) -> bool {
        self.accepts(alg)
            && jsonwebtoken::crypto::verify(signature, message, &self.key, alg.crate_alg())
                .unwrap_or(false)
    }
}

/// Whether a key from a remote JWKS is meant for verifying signatures: asymmetric types
/// only, `use` (if any) is `sig`, `key_ops` (if any) lists `verify`. `Err` says why not.
pub(crate) fn remote_key_usable(jwk: &Value) -> Result<(), &'static str> {
    match jwk.get("kty").and_then(Value::as_str) {
        Some("RSA" | "EC" | "OKP") => {}
        _ => return Err("only RSA, EC and OKP keys are taken from a JWKS URI"),
    }
    match jwk.get("use") {
        None | Some(Value::Null) => {}
        Some(Value::String(u)) if u == "sig" => {}
        Some(_) => return Err("`use` is not `sig`"),
    }
    match jwk.get("key_ops") {
        None | Some(Value::Null) => {}
        Some(Value::Array(ops)) if ops.iter().any(|op| op.as_str() == Some("verify")) => {}
        Some(_) => return Err("`key_ops` does not include `verify`"),
    }
    Ok(())
}

/// Bit length of a big-endian unsigned integer.
fn significant_bits(bytes: &[u8]) -> usize {
    let mut rest = bytes.iter().skip_while(|b| **b == 0);
    match rest.next() {
        None => 0,
        Some(first) => (8 - first.leading_zeros() as usize) + 8 * rest.count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret() -> Value {
        json!({"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"})
    }

    #[test]
    fn oct_key_accepts_hs_only() {
        let key = VerifyKey::from_jwk(&secret()).unwrap();
        assert!(key.accepts(TokenAlg::Hs256));
        assert!(key.accepts(TokenAlg::Hs512));
        assert!(!key.accepts(TokenAlg::Rs256));
        assert!(!key.accepts(TokenAlg::EdDsa));
    }

    #[test]
    fn jwk_alg_narrows_the_family() {
        let mut jwk = secret();
        jwk["alg"] = json!("HS384");
        let key = VerifyKey::from_jwk(&jwk).unwrap();
        assert!(key.accepts(TokenAlg::Hs384));
        assert!(!key.accepts(TokenAlg::Hs256));
    }

    #[test]
    fn jwk_alg_must_fit_the_key_type() {
        let mut jwk = secret();
        jwk["alg"] = json!("RS256");
        assert!(VerifyKey::from_jwk(&jwk)
            .unwrap_err()
            .contains("does not fit"));
        jwk["alg"] = json!("none");
        assert!(VerifyKey::from_jwk(&jwk).is_err());
    }

    #[test]
    fn bad_jwks_are_explained() {
        for (jwk, needle) in [
            (json!("x"), "JSON object"),
            (json!({"k": "AA"}), "`kty` is missing"),
            (json!({"kty": 3}), "must be a string"),
            (json!({"kty": "oct", "k": "***"}), "base64url"),
            (json!({"kty": "oct", "k": ""}), "empty"),
            (json!({"kty": "RSA", "n": "AQAB", "e": "AQAB"}), "bits"),
            (
                json!({"kty": "EC", "crv": "P-521", "x": "", "y": ""}),
                "P-521",
            ),
            (
                json!({"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}),
                "32 bytes",
            ),
            (json!({"kty": "OKP", "crv": "X25519", "x": "AA"}), "X25519"),
            (
                json!({"kty": "OKP", "crv": "Ed25519", "x": "AA"}),
                "32 bytes",
            ),
            (json!({"kty": "dh"}), "not supported"),
        ] {
            let err = VerifyKey::from_jwk(&jwk).unwrap_err();
            assert!(err.contains(needle), "{jwk}: {err}");
        }
    }

    #[test]
    fn hmac_verifies_and_rejects() {
        let key = VerifyKey::from_jwk(&secret()).unwrap();
        let message = b"header.payload";
        let signature = jsonwebtoken::crypto::sign(
            message,
            &jsonwebtoken::EncodingKey::from_secret(b"secret-secret-secret"),
            Algorithm::HS256,
        )
        .unwrap();
        assert!(key.verifies(TokenAlg::Hs256, message, &signature));
        assert!(!key.verifies(TokenAlg::Hs384, message, &signature));
        assert!(!key.verifies(TokenAlg::Hs256, b"header.other", &signature));
        assert!(!key.verifies(TokenAlg::Hs256, message, "!!not base64!!"));
    }

    #[test]
    fn remote_filter() {
        assert!(remote_key_usable(&json!({"kty": "RSA"})).is_ok());
        assert!(remote_key_usable(&json!({"kty": "RSA", "use": "sig"})).is_ok());
        assert!(remote_key_usable(&json!({"kty": "oct"})).is_err());
        assert!(remote_key_usable(&json!({"kty": "EC", "use": "enc"})).is_err());
        assert!(remote_key_usable(&json!({"kty": "OKP", "key_ops": ["sign"]})).is_err());
        assert!(remote_key_usable(&json!({"kty": "OKP", "key_ops": ["verify"]})).is_ok());
    }

    #[test]
    fn bit_lengths() {
        assert_eq!(significant_bits(&[]), 0);
        assert_eq!(significant_bits(&[0, 0]), 0);
        assert_eq!(significant_bits(&[0, 1]), 1);
        assert_eq!(significant_bits(&[0x80, 0]), 16);
    }

    #[test]
    fn short_hmac_secrets_are_warned_about() {
        let short = json!({"kty": "oct", "kid": "k1", "k": JWK_BASE64.encode(b"too-short")});
        let long = json!({"kty": "oct", "k": JWK_BASE64.encode([7u8; 32])});
        let warnings = weak_key_warnings(&[long, short]);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with("client_auth.jwks.keys[1] (kid k1): an HMAC secret of 9 bytes")
        );
    }
}
