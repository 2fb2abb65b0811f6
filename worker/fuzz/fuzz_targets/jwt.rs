//! Client tokens: `auth::Authenticator::authenticate` with a fixed set of inline keys
//! (HMAC with and without a kid, EC P-256, RSA, Ed25519; no network). The first byte picks
//! the mode:
//! - even: the rest is the `Authorization` header as sent;
//! - odd: the rest is `<header JSON>\n<payload JSON>`, which the target encodes and signs
//!   with the kid-less HMAC key (HS256/384/512 by the first byte), so the claim checks
//!   behind the signature are reached too.
#![no_main]

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use auth::Authenticator;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use config::ClientAuth;
use futures_util::FutureExt;
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

/// The kid-less HMAC key's secret.
const SECRET: &[u8] = b"fuzz-secret-0123456789abcdef0123456789abcdef";
/// "Now" for the claim checks (the seed tokens are valid then).
const NOW: u64 = 1_700_000_000;

fn jwk(text: &str, kid: Option<&str>) -> Value {
    let mut key: Value = serde_json::from_str(text).expect("a JWK fixture");
    if let Some(kid) = kid {
        key["kid"] = json!(kid);
    }
    key
}

static AUTH: LazyLock<Authenticator> = LazyLock::new(|| {
    let oct = |secret: &[u8], kid: Option<&str>| {
        let mut key = json!({"kty": "oct", "k": URL_SAFE_NO_PAD.encode(secret)});
        if let Some(kid) = kid {
            key["kid"] = json!(kid);
        }
        key
    };
    let keys = vec![
        oct(SECRET, None),
        oct(b"fuzz-secret-with-kid-0123456789abcdef0123", Some("hk")),
        jwk(
            include_str!("../../auth/tests/auth_keys/ec_p256.jwk.json"),
            Some("ec"),
        ),
        jwk(
            include_str!("../../auth/tests/auth_keys/rsa_a.jwk.json"),
            Some("rsa"),
        ),
        jwk(
            include_str!("../../auth/tests/auth_keys/ed25519.jwk.json"),
            None,
        ),
    ];
    Authenticator::new(&ClientAuth {
        jwks_keys: keys,
        audience: vec!["https://sync.example".to_owned()],
        issuer: Some("https://issuer.example".to_owned()),
        ..ClientAuth::default()
    })
    .expect("the fixed keys load")
});

/// `header.payload.signature`, signed with the kid-less HMAC key.
fn signed(alg: Algorithm, header: &[u8], payload: &[u8]) -> Option<String> {
    let message = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &EncodingKey::from_secret(SECRET), alg)
            .ok()?;
    Some(format!("Bearer {message}.{signature}"))
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let header = if mode % 2 == 0 {
        String::from_utf8_lossy(rest).into_owned()
    } else {
        let (jose, payload) = match rest.iter().position(|&b| b == b'\n') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &b"{}"[..]),
        };
        let alg = [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512][usize::from(mode / 2 % 3)];
        match signed(alg, jose, payload) {
            Some(header) => header,
            None => return,
        }
    };
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    // Inline keys only: nothing waits, so the future is ready at its first poll.
    let outcome = AUTH
        .authenticate(Some(&header), now)
        .now_or_never()
        .expect("inline keys never wait");
    if let Ok(user) = outcome {
        assert!(user.claims.is_object());
        assert!(user.expires_at > SystemTime::UNIX_EPOCH);
    }
});
