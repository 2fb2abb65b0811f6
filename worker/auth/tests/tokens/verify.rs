//! Signatures and token shape: every algorithm family, wrong keys, `alg: none`, key choice by
//! `kid`, malformed and random tokens.
use super::*;

#[tokio::test]
async fn every_algorithm_family_verifies() {
    let secret = json!({"kty": "oct", "k": b64(b"a shared secret of some length")});
    let auth = inline(vec![
        RSA_A.jwk(None, None),
        EC_P256.jwk(None, None),
        EC_P384.jwk(None, None),
        ED25519.jwk(None, None),
        secret,
    ]);
    for (pair, alg) in [
        (RSA_A, Algorithm::RS256),
        (RSA_A, Algorithm::RS384),
        (RSA_A, Algorithm::RS512),
        (EC_P256, Algorithm::ES256),
        (EC_P384, Algorithm::ES384),
        (ED25519, Algorithm::EdDSA),
    ] {
        let user = run(&auth, &pair.sign(alg, None, &claims())).await;
        let user = user.unwrap_or_else(|e| panic!("{alg:?}: {e}"));
        assert_eq!(user.user_id, "user-1");
        assert_eq!(user.claims["parameters"]["org"], 7);
        assert_eq!(user.expires_at, at() + Duration::from_secs(600));
    }
    for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
        let key = EncodingKey::from_secret(b"a shared secret of some length");
        let token = token_with(&key, alg, None, &claims());
        assert_eq!(code(&auth, &token).await, "ok", "{alg:?}");
    }
}

#[tokio::test]
async fn wrong_signatures_are_refused() {
    let auth = inline(vec![RSA_A.jwk(None, None), RSA_A.jwk(Some("a"), None)]);
    // Another key pair, with and without the kid.
    assert_eq!(
        code(&auth, &RSA_B.sign(Algorithm::RS256, None, &claims())).await,
        "PSYNC_S2102"
    );
    assert_eq!(
        code(&auth, &RSA_B.sign(Algorithm::RS256, Some("a"), &claims())).await,
        "PSYNC_S2102"
    );
    // A valid token whose payload was swapped.
    let good = RSA_A.sign(Algorithm::RS256, Some("a"), &claims());
    let mut parts: Vec<&str> = good.split('.').collect();
    let forged = b64(claims_with("sub", json!("admin")).to_string().as_bytes());
    parts[1] = &forged;
    assert_eq!(code(&auth, &parts.join(".")).await, "PSYNC_S2102");
    // An EC P-384 signature is not checked against a P-256 key.
    let ec = inline(vec![EC_P256.jwk(None, None)]);
    assert_eq!(
        code(&ec, &EC_P384.sign(Algorithm::ES384, None, &claims())).await,
        "PSYNC_S2101"
    );
}

#[tokio::test]
async fn header_must_carry_a_token() {
    let auth = inline(vec![RSA_A.jwk(None, None)]);
    assert_eq!(
        auth.authenticate(None, at()).await.unwrap_err().code(),
        "PSYNC_S2106"
    );
    let token = RSA_A.sign(Algorithm::RS256, None, &claims());
    let bare = token.strip_prefix("Token ").unwrap();
    assert_eq!(code(&auth, &format!("Bearer {bare}")).await, "ok");
    for header in [
        bare.to_owned(),
        format!("Basic {bare}"),
        format!("token {bare}"),
        String::new(),
    ] {
        assert_eq!(code(&auth, &header).await, "PSYNC_S2106", "{header:.20}");
    }
}

#[tokio::test]
async fn alg_none_is_refused() {
    let auth = inline(vec![
        RSA_A.jwk(None, None),
        json!({"kty": "oct", "k": b64(b"s")}),
    ]);
    let header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = b64(claims().to_string().as_bytes());
    for token in [
        format!("{header}.{payload}."),
        format!("{header}.{payload}.c2ln"),
    ] {
        let err = run(&auth, &format!("Token {token}")).await.unwrap_err();
        assert!(
            matches!(err, AuthError::UnsupportedAlgorithm { .. }),
            "{err}"
        );
        assert_eq!(err.code(), "PSYNC_S2101");
    }
}

#[tokio::test]
async fn rsa_public_key_is_never_an_hmac_secret() {
    // The classic confusion: HS256 "signed" with the RSA public key's bytes.
    let auth = inline(vec![RSA_A.jwk(None, None), RSA_A.jwk(Some("rsa"), None)]);
    for secret in [RSA_A.public_pem.as_bytes(), RSA_A.jwk.as_bytes()] {
        let key = EncodingKey::from_secret(secret);
        let err = run(&auth, &token_with(&key, Algorithm::HS256, None, &claims()))
            .await
            .unwrap_err();
        assert!(matches!(err, AuthError::NoSuitableKey { .. }), "{err}");
        let err = run(
            &auth,
            &token_with(&key, Algorithm::HS256, Some("rsa"), &claims()),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, AuthError::UnexpectedAlgorithm { .. }),
            "{err}"
        );
    }
}

#[tokio::test]
async fn kid_selects_the_key_and_wildcards_are_tried_in_order() {
    let auth = inline(vec![
        RSA_A.jwk(Some("a"), Some("RS256")),
        RSA_B.jwk(Some("b"), None),
        EC_P256.jwk(None, None),
        RSA_B.jwk(None, Some("RS512")),
        RSA_A.jwk(None, None),
    ]);
    assert_eq!(
        code(&auth, &RSA_A.sign(Algorithm::RS256, Some("a"), &claims())).await,
        "ok"
    );
    assert_eq!(
        code(&auth, &RSA_B.sign(Algorithm::RS384, Some("b"), &claims())).await,
        "ok"
    );
    // kid "a" is RS256 only.
    let err = run(&auth, &RSA_A.sign(Algorithm::RS384, Some("a"), &claims())).await;
    assert!(matches!(err, Err(AuthError::UnexpectedAlgorithm { .. })));
    // Wildcards: RSA_B (RS512 only) is skipped for RS256, RSA_A verifies; RS512 from
    // RSA_A is tried against RSA_B first, then RSA_A.
    assert_eq!(
        code(&auth, &RSA_A.sign(Algorithm::RS256, None, &claims())).await,
        "ok"
    );
    assert_eq!(
        code(&auth, &RSA_A.sign(Algorithm::RS512, None, &claims())).await,
        "ok"
    );
    assert_eq!(
        code(&auth, &RSA_B.sign(Algorithm::RS512, None, &claims())).await,
        "ok"
    );
    // Unknown kid falls back to the wildcards.
    assert_eq!(
        code(
            &auth,
            &EC_P256.sign(Algorithm::ES256, Some("zz"), &claims())
        )
        .await,
        "ok"
    );
    // Nothing for EdDSA.
    let err = run(&auth, &ED25519.sign(Algorithm::EdDSA, None, &claims()))
        .await
        .unwrap_err();
    assert!(matches!(err, AuthError::NoSuitableKey { .. }), "{err}");
}

#[tokio::test]
async fn malformed_tokens_are_refused() {
    let auth = inline(vec![RSA_A.jwk(None, None)]);
    let header = b64(br#"{"alg":"RS256"}"#);
    let payload = b64(claims().to_string().as_bytes());
    let huge = format!("{header}.{}.c2ln", "A".repeat(1 << 20));
    for token in [
        "garbage".to_owned(),
        "onlyonesegment".to_owned(),
        "a.b".to_owned(),
        "...".to_owned(),
        format!("{header}.{payload}"),
        format!("{header}.{payload}.!!!"),
        format!("%%%.{payload}.c2ln"),
        format!("{header}.{payload}.c2ln.extra"),
        huge,
    ] {
        let err = run(&auth, &format!("Token {token}")).await.unwrap_err();
        assert_eq!(err.http_status(), 401, "{token:.40}: {err}");
        assert!(err.to_string().len() < 400, "messages stay short: {err}");
    }
}

/// xorshift64*: a fixed-seed source of random inputs without another dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[tokio::test]
async fn random_inputs_never_panic_or_pass() {
    let auth = inline(vec![
        RSA_A.jwk(None, None),
        EC_P256.jwk(Some("ec"), None),
        ED25519.jwk(None, None),
        json!({"kty": "oct", "k": b64(b"secret")}),
    ]);
    let valid = RSA_A.sign(Algorithm::RS256, None, &claims());
    assert_eq!(code(&auth, &valid).await, "ok");
    let alphabet: Vec<char> =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ {}\"é\u{0}"
            .chars()
            .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for round in 0..3000 {
        let input = match round % 3 {
            // Random text after a valid scheme.
            0 => {
                let len = rng.below(300);
                let body: String = (0..len)
                    .map(|_| alphabet[rng.below(alphabet.len())])
                    .collect();
                format!("Token {body}")
            }
            // A valid token with a few characters replaced.
            1 => {
                let mut chars: Vec<char> = valid.chars().collect();
                for _ in 0..=rng.below(4) {
                    let at = 6 + rng.below(chars.len() - 6);
                    chars[at] = alphabet[rng.below(alphabet.len())];
                }
                chars.into_iter().collect()
            }
            // Random JSON-ish header and payload, base64url-encoded, random signature.
            _ => {
                let pieces = [
                    "{",
                    "}",
                    "\"alg\":",
                    "\"RS256\"",
                    "\"none\"",
                    "\"kid\":\"ec\"",
                    ",",
                    "\"exp\":",
                    "1e999",
                    "-1",
                    "null",
                    "[",
                    "]",
                    "\"sub\":",
                    "0",
                ];
                let mut part = || -> String {
                    let n = rng.below(8);
                    let text: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
                    b64(text.as_bytes())
                };
                let (h, p, s) = (part(), part(), part());
                format!("Bearer {h}.{p}.{s}")
            }
        };
        if input == valid {
            continue;
        }
        let result = run(&auth, &input).await;
        assert!(result.is_err(), "accepted a mangled token: {input}");
    }
}
