//! Remote keys from a local JWKS server: fetching, refetching, refreshing, failures, Supabase
//! and refused addresses.
use super::*;

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
