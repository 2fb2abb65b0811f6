//! Client JWT authentication with real key pairs (fixtures in `tests/auth_keys/`, made by its
//! `generate.sh`) and a local JWKS server on 127.0.0.1.
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
            private: include_str!(concat!("auth_keys/", $name, ".pem")),
            public_pem: include_str!(concat!("auth_keys/", $name, ".pub.pem")),
            jwk: include_str!(concat!("auth_keys/", $name, ".jwk.json")),
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
async fn expiry_uses_a_60_second_tolerance() {
    let auth = inline(vec![ED25519.jwk(None, None)]);
    let sign = |exp: u64| ED25519.sign(Algorithm::EdDSA, None, &claims_with("exp", json!(exp)));
    assert_eq!(code(&auth, &sign(NOW - 30)).await, "ok");
    assert_eq!(code(&auth, &sign(NOW - 61)).await, "PSYNC_S2103");
    let err = run(&auth, &sign(NOW - 3600)).await.unwrap_err();
    assert!(matches!(err, AuthError::Expired { .. }));
    assert_eq!(err.http_status(), 401);
    // nbf in the future beyond the tolerance.
    let early = ED25519.sign(
        Algorithm::EdDSA,
        None,
        &claims_with("nbf", json!(NOW + 120)),
    );
    assert_eq!(code(&auth, &early).await, "PSYNC_S2101");
}

#[tokio::test]
async fn lifetime_over_a_day_is_refused() {
    let auth = inline(vec![EC_P256.jwk(None, None)]);
    let mut c = claims();
    c["iat"] = json!(NOW - 10);
    c["exp"] = json!(NOW - 10 + 86_400);
    assert_eq!(
        code(&auth, &EC_P256.sign(Algorithm::ES256, None, &c)).await,
        "ok"
    );
    c["exp"] = json!(NOW - 10 + 86_401);
    assert_eq!(
        code(&auth, &EC_P256.sign(Algorithm::ES256, None, &c)).await,
        "PSYNC_S2104"
    );
}

#[tokio::test]
async fn audience_must_match() {
    let auth = inline(vec![RSA_A.jwk(None, None)]);
    let sign = |c: &Value| RSA_A.sign(Algorithm::RS256, None, c);
    assert_eq!(
        code(&auth, &sign(&claims_with("aud", json!(["x", AUD])))).await,
        "ok"
    );
    assert_eq!(
        code(&auth, &sign(&claims_with("aud", json!("x")))).await,
        "PSYNC_S2105"
    );
    assert_eq!(
        code(&auth, &sign(&claims_without("aud"))).await,
        "PSYNC_S2105"
    );

    let unconfigured = Authenticator::new(&ClientAuth {
        jwks_keys: vec![RSA_A.jwk(None, None)],
        ..ClientAuth::default()
    })
    .unwrap();
    let err = run(&unconfigured, &sign(&claims())).await.unwrap_err();
    assert_eq!(err.code(), "PSYNC_S2105");
    assert!(err.to_string().contains("client_auth.audience"), "{err}");
}

#[tokio::test]
async fn issuer_when_configured() {
    let auth = Authenticator::new(&ClientAuth {
        jwks_keys: vec![RSA_A.jwk(None, None)],
        audience: vec![AUD.to_owned()],
        issuer: Some("https://auth.example".to_owned()),
        ..ClientAuth::default()
    })
    .unwrap();
    let sign = |c: &Value| RSA_A.sign(Algorithm::RS256, None, c);
    let ok = claims_with("iss", json!("https://auth.example"));
    assert_eq!(code(&auth, &sign(&ok)).await, "ok");
    assert_eq!(code(&auth, &sign(&claims())).await, "PSYNC_S2101");
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
async fn required_claims_and_parameters() {
    let auth = inline(vec![EC_P256.jwk(None, None)]);
    let sign = |c: &Value| EC_P256.sign(Algorithm::ES256, None, c);
    for claim in ["sub", "iat", "exp"] {
        let err = run(&auth, &sign(&claims_without(claim))).await.unwrap_err();
        assert!(
            matches!(err, AuthError::MissingClaim { .. }),
            "{claim}: {err}"
        );
        assert_eq!(err.code(), "PSYNC_S2101");
    }
    for bad in [json!([1]), json!("a=b"), json!(3)] {
        let err = run(&auth, &sign(&claims_with("parameters", bad)))
            .await
            .unwrap_err();
        assert_eq!(err, AuthError::InvalidParameters);
    }
    let user = run(&auth, &sign(&claims_with("sub", json!(12345))))
        .await
        .unwrap();
    assert_eq!(user.user_id, "12345");
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

/// A JWKS server on 127.0.0.1 whose answer the test changes, counting requests.
struct JwksServer {
    uri: String,
    hits: Arc<AtomicUsize>,
    answer: Arc<Mutex<(u16, String)>>,
}

impl JwksServer {
    async fn start(keys: Vec<Value>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}/api/auth/keys", listener.local_addr().unwrap());
        let hits = Arc::new(AtomicUsize::new(0));
        let answer = Arc::new(Mutex::new((200, json!({"keys": keys}).to_string())));
        let (h, a) = (Arc::clone(&hits), Arc::clone(&answer));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (h, a) = (Arc::clone(&h), Arc::clone(&a));
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    assert!(request.starts_with(b"GET /api/auth/keys HTTP/1.1\r\n"));
                    h.fetch_add(1, Ordering::SeqCst);
                    let (status, body) = a.lock().unwrap().clone();
                    let head = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(head.as_bytes()).await;
                    let _ = stream.write_all(body.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { uri, hits, answer }
    }

    fn serve(&self, keys: Vec<Value>) {
        *self.answer.lock().unwrap() = (200, json!({"keys": keys}).to_string());
    }

    fn fail(&self, status: u16, body: &str) {
        *self.answer.lock().unwrap() = (status, body.to_owned());
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn auth(&self, options: AuthOptions) -> Authenticator {
        Authenticator::with_options(
            &ClientAuth {
                jwks_uri: vec![self.uri.clone()],
                audience: vec![AUD.to_owned()],
                ..ClientAuth::default()
            },
            options,
        )
        .unwrap()
    }
}

fn quick(miss_refetch_ms: u64, refresh_ms: u64) -> AuthOptions {
    AuthOptions {
        jwks_miss_refetch_after: Duration::from_millis(miss_refetch_ms),
        jwks_refresh_after: Duration::from_millis(refresh_ms),
        jwks_fetch_timeout: Duration::from_secs(5),
        ..AuthOptions::default()
    }
}

#[tokio::test]
async fn jwks_keys_are_fetched_once_and_filtered() {
    let server = JwksServer::start(vec![
        RSA_A.jwk(Some("a1"), Some("RS256")),
        RSA_B
            .jwk(Some("b-enc"), None)
            .as_object()
            .cloned()
            .map(|mut m| {
                m.insert("use".into(), json!("enc"));
                Value::Object(m)
            })
            .unwrap(),
        EC_P256
            .jwk(Some("ec-sign-only"), None)
            .as_object()
            .cloned()
            .map(|mut m| {
                m.insert("key_ops".into(), json!(["sign"]));
                Value::Object(m)
            })
            .unwrap(),
        json!({"kty": "oct", "kid": "hs", "k": b64(b"secret")}),
        json!({"kty": "RSA", "kid": "broken", "n": "AA", "e": "AQAB"}),
    ])
    .await;
    let auth = server.auth(AuthOptions::default());
    // Concurrent first requests share one fetch.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let auth = auth.clone();
            let token = RSA_A.sign(Algorithm::RS256, Some("a1"), &claims());
            tokio::spawn(async move { auth.authenticate(Some(&token), at()).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().user_id, "user-1");
    }
    assert_eq!(server.hits(), 1);
    // Skipped keys stay unknown; the miss refetch is rate limited (30 s), so no new fetch.
    for (pair, alg, kid) in [
        (RSA_B, Algorithm::RS256, "b-enc"),
        (EC_P256, Algorithm::ES256, "ec-sign-only"),
    ] {
        let err = run(&auth, &pair.sign(alg, Some(kid), &claims()))
            .await
            .unwrap_err();
        assert!(
            matches!(err, AuthError::NoSuitableKey { .. }),
            "{kid}: {err}"
        );
    }
    let hs = token_with(
        &EncodingKey::from_secret(b"secret"),
        Algorithm::HS256,
        Some("hs"),
        &claims(),
    );
    assert_eq!(code(&auth, &hs).await, "PSYNC_S2101");
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn unknown_kid_refetches_at_most_once_per_interval() {
    let server = JwksServer::start(vec![RSA_A.jwk(Some("a1"), None)]).await;
    // An interval long enough for the steps inside it on a slow machine.
    let auth = server.auth(quick(1_500, 3_600_000));
    assert_eq!(
        code(&auth, &RSA_A.sign(Algorithm::RS256, Some("a1"), &claims())).await,
        "ok"
    );
    assert_eq!(server.hits(), 1);

    // Rotation: the issuer now signs with b1. Right after a fetch, the miss does not refetch.
    server.serve(vec![RSA_B.jwk(Some("b1"), None)]);
    let b1 = RSA_B.sign(Algorithm::RS256, Some("b1"), &claims());
    assert_eq!(code(&auth, &b1).await, "PSYNC_S2101");
    assert_eq!(server.hits(), 1);

    // After the interval, the miss refetches and the retry verifies.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(code(&auth, &b1).await, "ok");
    assert_eq!(server.hits(), 2);
    // Old keys are gone with the rotation.
    assert_eq!(
        code(&auth, &RSA_A.sign(Algorithm::RS256, Some("a1"), &claims())).await,
        "PSYNC_S2101"
    );
    // ...and a burst of unknown kids inside the interval costs no fetches.
    for i in 0..20 {
        let kid = format!("forged-{i}");
        let t = RSA_A.sign(Algorithm::RS256, Some(&kid), &claims());
        assert_eq!(code(&auth, &t).await, "PSYNC_S2101");
    }
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn old_keys_refresh_in_the_background_and_survive_failures() {
    let server = JwksServer::start(vec![ED25519.jwk(Some("e1"), None)]).await;
    let auth = server.auth(quick(0, 200));
    let e1 = ED25519.sign(Algorithm::EdDSA, Some("e1"), &claims());
    assert_eq!(code(&auth, &e1).await, "ok");
    assert_eq!(server.hits(), 1);

    // The server breaks; once the keys are old, a request starts a refresh that fails.
    server.fail(500, "oops");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(code(&auth, &e1).await, "ok");
    wait_for("the failing background refresh", || server.hits() >= 2).await;
    // The cached key is still used.
    assert_eq!(code(&auth, &e1).await, "ok");

    // Fixed again with a new key: the next background refresh picks it up.
    server.serve(vec![EC_P384.jwk(Some("p1"), None)]);
    let hits = server.hits();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let _ = run(&auth, &e1).await;
    wait_for("the next background refresh", || server.hits() > hits).await;
    let p1 = EC_P384.sign(Algorithm::ES384, Some("p1"), &claims());
    let mut waiting = Waiting::new("the refreshed key in use");
    while code(&auth, &p1).await != "ok" {
        waiting.progress(());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for `condition` (within the test rig's stall limit).
async fn wait_for(what: &str, condition: impl Fn() -> bool) {
    let mut waiting = Waiting::new(what);
    while !condition() {
        waiting.progress(());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn unreachable_jwks_without_keys_is_503() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}/jwks", listener.local_addr().unwrap());
    drop(listener);
    let auth = Authenticator::new(&ClientAuth {
        jwks_uri: vec![uri.clone()],
        audience: vec![AUD.to_owned()],
        ..ClientAuth::default()
    })
    .unwrap();
    let err = run(&auth, &RSA_A.sign(Algorithm::RS256, Some("a1"), &claims()))
        .await
        .unwrap_err();
    assert_eq!(err.http_status(), 503, "{err}");
    assert_eq!(err.code(), "PSYNC_S2204");
    assert!(err.to_string().contains(&uri), "{err}");
    // A missing header is still the client's problem, not the outage.
    assert_eq!(
        auth.authenticate(None, at())
            .await
            .unwrap_err()
            .http_status(),
        401
    );
}

#[tokio::test]
async fn bad_jwks_answers_are_503_with_the_reason() {
    let server = JwksServer::start(vec![]).await;
    let token = RSA_A.sign(Algorithm::RS256, None, &claims());
    for (status, body, reason) in [
        (404, "{}".to_owned(), "HTTP 404"),
        (200, "not json".to_owned(), "not JSON"),
        (200, "{\"nokeys\":[]}".to_owned(), "no `keys` array"),
        (
            200,
            format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(2 << 20)),
            "larger than",
        ),
    ] {
        server.fail(status, &body);
        let auth = server.auth(AuthOptions::default());
        let err = run(&auth, &token).await.unwrap_err();
        assert_eq!(err.http_status(), 503, "{err}");
        assert!(err.to_string().contains(reason), "{err}");
    }
    // An empty key set is not an outage: the token simply has no key.
    server.serve(vec![]);
    let err = run(&server.auth(AuthOptions::default()), &token)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "PSYNC_S2101");
}

#[tokio::test]
async fn inline_and_remote_keys_work_together() {
    let server = JwksServer::start(vec![RSA_B.jwk(Some("remote"), None)]).await;
    let auth = Authenticator::new(&ClientAuth {
        jwks_uri: vec![server.uri.clone()],
        jwks_keys: vec![ED25519.jwk(Some("local"), None)],
        audience: vec![AUD.to_owned()],
        ..ClientAuth::default()
    })
    .unwrap();
    assert_eq!(
        code(
            &auth,
            &ED25519.sign(Algorithm::EdDSA, Some("local"), &claims())
        )
        .await,
        "ok"
    );
    assert_eq!(
        code(
            &auth,
            &RSA_B.sign(Algorithm::RS256, Some("remote"), &claims())
        )
        .await,
        "ok"
    );
}

/// Claims of a Supabase Auth token: `aud: authenticated`, living `lifetime` seconds.
fn supabase_claims(lifetime: u64) -> Value {
    json!({"sub": "supabase-user", "iat": NOW - 10, "exp": NOW - 10 + lifetime,
           "aud": "authenticated", "iss": "https://proj.supabase.co/auth/v1",
           "role": "authenticated"})
}

#[tokio::test]
async fn supabase_tokens_are_taken_as_the_official_service_takes_them() {
    // A local server stands in for the project's JWKS (the test override of its URL).
    let server = JwksServer::start(vec![EC_P256.jwk(Some("supabase-ecc"), Some("ES256"))]).await;
    let secret = "a-legacy-supabase-jwt-secret-of-40-bytes";
    let auth = Authenticator::new(&ClientAuth {
        jwks_keys: vec![RSA_A.jwk(Some("app"), None)],
        audience: vec![AUD.to_owned()],
        issuer: Some("https://auth.example".to_owned()),
        supabase: Some(config::Supabase {
            jwks_uri: Some(server.uri.clone()),
            jwt_secret: Some(secret.to_owned()),
        }),
        ..ClientAuth::default()
    })
    .unwrap();
    let legacy = EncodingKey::from_secret(secret.as_bytes());
    let week = 86_400 * 7;
    // Signing keys and the legacy secret (any kid matches it), `aud: authenticated`
    // whatever `audience` says, up to a week, no `issuer` check.
    let signed = EC_P256.sign(
        Algorithm::ES256,
        Some("supabase-ecc"),
        &supabase_claims(week),
    );
    let user = run(&auth, &signed).await.unwrap();
    assert_eq!(user.user_id, "supabase-user");
    let hs256 = token_with(
        &legacy,
        Algorithm::HS256,
        Some("any-kid"),
        &supabase_claims(3600),
    );
    assert_eq!(code(&auth, &hs256).await, "ok");
    let hs256 = token_with(&legacy, Algorithm::HS256, None, &supabase_claims(3600));
    assert_eq!(code(&auth, &hs256).await, "ok");
    // Another audience, or more than a week and 20 minutes, is refused.
    let mut other_aud = supabase_claims(3600);
    other_aud["aud"] = json!(AUD);
    let refused = token_with(&legacy, Algorithm::HS256, None, &other_aud);
    assert_eq!(code(&auth, &refused).await, "PSYNC_S2105");
    let too_long = token_with(
        &legacy,
        Algorithm::HS256,
        None,
        &supabase_claims(week + 1201),
    );
    assert_eq!(code(&auth, &too_long).await, "PSYNC_S2104");
    // The app's own keys keep the configured audience, issuer and one-day limit.
    let app = RSA_A.sign(
        Algorithm::RS256,
        Some("app"),
        &claims_with("iss", json!("https://auth.example")),
    );
    assert_eq!(code(&auth, &app).await, "ok");
    let app_supabase_aud = RSA_A.sign(Algorithm::RS256, Some("app"), &supabase_claims(3600));
    assert_ne!(code(&auth, &app_supabase_aud).await, "ok");
    // A wrong secret is a bad signature.
    let forged = token_with(
        &EncodingKey::from_secret(b"another-secret-that-is-long-enough-too!!"),
        Algorithm::HS256,
        None,
        &supabase_claims(3600),
    );
    assert_eq!(code(&auth, &forged).await, "PSYNC_S2102");
}

#[tokio::test]
async fn jwks_at_refused_addresses_are_not_fetched() {
    let server = JwksServer::start(vec![RSA_A.jwk(Some("a1"), None)]).await;
    let client_auth = |ranges: &[&str], ipv6: bool| ClientAuth {
        jwks_uri: vec![server.uri.clone()],
        audience: vec![AUD.to_owned()],
        jwks_reject_ip_ranges: ranges.iter().map(|r| (*r).to_owned()).collect(),
        jwks_reject_ipv6: ipv6,
        ..ClientAuth::default()
    };
    // The URI names 127.0.0.1: refused when the configuration loads.
    for ranges in [&["local"][..], &["127.0.0.0/8"][..]] {
        let error = Authenticator::new(&client_auth(ranges, false)).unwrap_err();
        assert!(error.to_string().contains("refuses"), "{error}");
    }
    // Elsewhere, it is fetched.
    let auth = Authenticator::new(&client_auth(&["10.0.0.0/8"], true)).unwrap();
    let token = RSA_A.sign(Algorithm::RS256, Some("a1"), &claims());
    assert_eq!(code(&auth, &token).await, "ok");
    // A name is checked once resolved.
    let by_name = server.uri.replace("127.0.0.1", "localhost");
    let auth = Authenticator::new(&ClientAuth {
        jwks_uri: vec![by_name],
        ..client_auth(&["local"], false)
    })
    .unwrap();
    let error = run(&auth, &token).await.unwrap_err();
    assert!(
        error.to_string().contains("PSYNC_S2203") && error.to_string().contains("public unicast"),
        "{error}"
    );
    assert_eq!(
        server.hits(),
        1,
        "only the unrestricted fetch reached the server"
    );
}
