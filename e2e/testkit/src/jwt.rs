//! Client tokens for live tests: HS256 JWTs signed with a test secret.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unpadded base64url, as JWKS `k` values and JWT parts use.
pub fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// An HS256 token (key id `k1`) for `sub` and `audience`, valid for `lifetime` seconds.
pub fn hs256_token(secret: &[u8], audience: &str, sub: &str, lifetime: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    let claims =
        serde_json::json!({"sub": sub, "aud": audience, "iat": now, "exp": now + lifetime});
    #[allow(clippy::expect_used)]
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .expect("an HS256 token always encodes")
}

/// A sync replica's configuration file: replication from `primary_uri` without TLS, one
/// global bucket of `data_query`, HS256 tokens signed with `secret` for `audience`, HTTP
/// on `port`.
pub fn global_bucket_config(
    primary_uri: &str,
    data_query: &str,
    secret: &[u8],
    audience: &str,
    port: u16,
) -> String {
    let rules = format!("bucket_definitions:\n  global:\n    data:\n      - {data_query}\n");
    rules_config(primary_uri, &rules, secret, audience, port)
}

/// [`global_bucket_config`] with the sync rules `rules` (YAML).
pub fn rules_config(
    primary_uri: &str,
    rules: &str,
    secret: &[u8],
    audience: &str,
    port: u16,
) -> String {
    let rules: String = rules.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "replication:\n  connections:\n    - uri: {primary_uri}\n      sslmode: disable\n\
         sync_config:\n  content: |\n{rules}\
         client_auth:\n  audience: [{audience}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: k1, k: '{}'}}\n\
         port: {port}\n",
        base64_url(secret)
    )
}
