//! Client JWT authentication with real key pairs (fixtures in `tests/auth_keys/`, made by its
//! `generate.sh`) and a local JWKS server on 127.0.0.1. Fixtures and helpers here; the tests by
//! topic in `verify`, `claims` and `jwks`.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use auth::{AuthError, AuthOptions, AuthenticatedUser, Authenticator};
use config::ClientAuth;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use testkit::Waiting;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NOW: u64 = 1_700_000_000;
const AUD: &str = "https://sync.example";

fn at() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

/// A fixture key pair.
#[derive(Clone, Copy)]
struct Pair {
    private: &'static str,
    public_pem: &'static str,
    jwk: &'static str,
}

macro_rules! pair {
    ($name:literal) => {
        Pair {
            private: include_str!(concat!("../auth_keys/", $name, ".pem")),
            public_pem: include_str!(concat!("../auth_keys/", $name, ".pub.pem")),
            jwk: include_str!(concat!("../auth_keys/", $name, ".jwk.json")),
        }
    };
}

const RSA_A: Pair = pair!("rsa_a");
const RSA_B: Pair = pair!("rsa_b");
const EC_P256: Pair = pair!("ec_p256");
const EC_P384: Pair = pair!("ec_p384");
const ED25519: Pair = pair!("ed25519");

impl Pair {
    /// The public JWK with an optional `kid` and `alg`.
    fn jwk(self, kid: Option<&str>, alg: Option<&str>) -> Value {
        let mut jwk: Value = serde_json::from_str(self.jwk).unwrap();
        if let Some(kid) = kid {
            jwk["kid"] = json!(kid);
        }
        if let Some(alg) = alg {
            jwk["alg"] = json!(alg);
        }
        jwk
    }

    fn encoding_key(self, alg: Algorithm) -> EncodingKey {
        let pem = self.private.as_bytes();
        match alg {
            Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 => {
                EncodingKey::from_rsa_pem(pem).unwrap()
            }
            Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(pem).unwrap(),
            Algorithm::EdDSA => EncodingKey::from_ed_pem(pem).unwrap(),
            other => panic!("no fixture for {other:?}"),
        }
    }

    /// `Token <jwt>` signed with this pair.
    fn sign(self, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
        token_with(&self.encoding_key(alg), alg, kid, claims)
    }
}

fn token_with(key: &EncodingKey, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    format!("Token {}", encode(&header, claims, key).unwrap())
}

fn claims() -> Value {
    json!({"sub": "user-1", "iat": NOW - 10, "exp": NOW + 600, "aud": AUD,
           "parameters": {"org": 7}})
}

fn claims_with(key: &str, value: Value) -> Value {
    let mut c = claims();
    c[key] = value;
    c
}

fn claims_without(key: &str) -> Value {
    let mut c = claims();
    c.as_object_mut().unwrap().remove(key);
    c
}

fn inline(keys: Vec<Value>) -> Authenticator {
    Authenticator::new(&ClientAuth {
        jwks_keys: keys,
        audience: vec![AUD.to_owned()],
        ..ClientAuth::default()
    })
    .unwrap()
}

async fn run(auth: &Authenticator, header: &str) -> Result<AuthenticatedUser, AuthError> {
    auth.authenticate(Some(header), at()).await
}

async fn code(auth: &Authenticator, header: &str) -> &'static str {
    match run(auth, header).await {
        Ok(_) => "ok",
        Err(e) => e.code(),
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

mod claims;
mod jwks;
mod verify;
