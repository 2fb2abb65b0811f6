//! Authenticator tests with HMAC keys (no fixtures, no network); real key pairs and JWKS
//! fetching are in `tests/auth.rs`.

use super::*;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use std::time::UNIX_EPOCH;

const NOW: u64 = 1_700_000_000;
const AUD: &str = "https://sync.example";

fn at() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

fn oct(secret: &str, kid: Option<&str>, alg: Option<&str>) -> Value {
    let mut jwk = json!({"kty": "oct", "k": base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD, secret)});
    if let Some(kid) = kid {
        jwk["kid"] = json!(kid);
    }
    if let Some(alg) = alg {
        jwk["alg"] = json!(alg);
    }
    jwk
}

fn auth(keys: Vec<Value>) -> Authenticator {
    Authenticator::new(&ClientAuth {
        jwks_keys: keys,
        audience: vec![AUD.to_owned()],
        ..ClientAuth::default()
    })
    .unwrap()
}

fn claims() -> Value {
    json!({"sub": "user-1", "iat": NOW, "exp": NOW + 300, "aud": AUD})
}

fn sign(secret: &str, alg: Algorithm, kid: Option<&str>) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    let token = encode(
        &header,
        &claims(),
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    format!("Token {token}")
}

async fn run(a: &Authenticator, header: &str) -> Result<AuthenticatedUser, AuthError> {
    a.authenticate(Some(header), at()).await
}

#[tokio::test]
async fn accepts_a_valid_token() {
    let a = auth(vec![oct("s1", None, None)]);
    let user = run(&a, &sign("s1", Algorithm::HS256, None)).await.unwrap();
    assert_eq!(user.user_id, "user-1");
    assert_eq!(user.claims["aud"], AUD);
    assert_eq!(user.expires_at, at() + Duration::from_secs(300));
}

#[tokio::test]
async fn wildcard_keys_are_tried_in_order() {
    let a = auth(vec![
        oct("s1", None, Some("HS512")),
        oct("s2", None, None),
        oct("s3", None, None),
    ]);
    for (secret, alg) in [
        ("s1", Algorithm::HS512),
        ("s2", Algorithm::HS256),
        ("s3", Algorithm::HS384),
    ] {
        assert!(run(&a, &sign(secret, alg, None)).await.is_ok(), "{secret}");
    }
    // s1 is restricted to HS512.
    let err = run(&a, &sign("s1", Algorithm::HS256, None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PSYNC_S2102");
}

#[tokio::test]
async fn kid_selects_the_key() {
    let a = auth(vec![oct("a", Some("ka"), None), oct("b", Some("kb"), None)]);
    assert!(run(&a, &sign("b", Algorithm::HS256, Some("kb")))
        .await
        .is_ok());
    // Right secret, wrong kid: the kid's key decides.
    let err = run(&a, &sign("b", Algorithm::HS256, Some("ka")))
        .await
        .unwrap_err();
    assert!(matches!(err, AuthError::BadSignature { .. }), "{err}");
    // Keys with a kid are not wildcards.
    let err = run(&a, &sign("a", Algorithm::HS256, None))
        .await
        .unwrap_err();
    assert!(matches!(err, AuthError::NoSuitableKey { .. }), "{err}");
    // Unknown kid and no wildcard.
    let err = run(&a, &sign("a", Algorithm::HS256, Some("kz")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PSYNC_S2101");
}

#[tokio::test]
async fn unknown_kid_falls_back_to_wildcards() {
    let a = auth(vec![oct("a", Some("ka"), None), oct("w", None, None)]);
    assert!(run(&a, &sign("w", Algorithm::HS256, Some("other")))
        .await
        .is_ok());
}

#[tokio::test]
async fn kid_with_another_algorithm_is_unexpected() {
    let a = auth(vec![oct("a", Some("ka"), Some("HS256"))]);
    let err = run(&a, &sign("a", Algorithm::HS384, Some("ka")))
        .await
        .unwrap_err();
    assert!(
        matches!(err, AuthError::UnexpectedAlgorithm { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("Unexpected token algorithm"));
    assert_eq!(err.http_status(), 401);
}

#[tokio::test]
async fn header_problems() {
    let a = auth(vec![oct("s1", None, None)]);
    let err = a.authenticate(None, at()).await.unwrap_err();
    assert_eq!(err.code(), "PSYNC_S2106");
    let token = sign("s1", Algorithm::HS256, None);
    let bare = token.trim_start_matches("Token ");
    assert!(run(&a, &format!("Bearer {bare}")).await.is_ok());
    let err = run(&a, &format!("Basic {bare}")).await.unwrap_err();
    assert_eq!(err.code(), "PSYNC_S2106");
}

#[test]
fn bad_inline_keys_are_config_errors() {
    let err = Authenticator::new(&ClientAuth {
        jwks_keys: vec![oct("s1", None, None), json!({"kty": "RSA", "n": "AA"})],
        ..ClientAuth::default()
    })
    .unwrap_err();
    assert!(
        matches!(err, AuthError::InvalidKey { index: 1, .. }),
        "{err}"
    );
    assert_eq!(err.code(), "PSYNC_S2201");
    assert!(
        err.to_string().contains("client_auth.jwks.keys[1]"),
        "{err}"
    );

    let err = Authenticator::new(&ClientAuth {
        jwks_uri: vec!["ftp://keys.example/jwks".to_owned()],
        ..ClientAuth::default()
    })
    .unwrap_err();
    assert!(matches!(err, AuthError::InvalidJwksUri { .. }), "{err}");
}

#[test]
fn authenticator_is_shareable() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Authenticator>();
}
