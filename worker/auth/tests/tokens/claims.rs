//! Claims: expiry and its tolerance, lifetime, audience, issuer, required claims and
//! parameters.
use super::*;

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
