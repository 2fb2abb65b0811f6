//! Tokens: short-lived ones refreshed by the SDK, and Supabase Auth's (legacy JWT secret
//! and a signing key from the project's JWKS).
use serde_json::{json, Value};
use testkit::PgInstall;

use super::{assert_no_warnings, assert_rows, wait_equal, Rig, Rules, AUDIENCE, USER};

/// Short-lived tokens: the client refreshes its credentials before they expire (the
/// server's `token_expires_in` lines) and keeps syncing on the new connection.
#[test]
fn sdk_refreshes_expiring_tokens() {
    let rig = Rig::start(Rules::Legacy);
    let mut client = rig.client().with_env("PSM_TOKEN_TTL_S", "35").watch();
    let answer =
        client.try_send(&json!({"cmd": "wait_credentials", "count": 2, "timeout_ms": 30000}));
    assert!(
        answer["ok"] == true,
        "the client fetched new credentials before the token expired: {answer}"
    );
    rig.primary.sql(
        "UPDATE tasks SET title = 'After a token refresh' WHERE id = 'task-sentinel-update-0001'",
    );
    wait_equal(&mut client, &rig, "after a token refresh");
    let last = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&last, "token refresh");
    client.finish();
}

/// A JWKS document served on 127.0.0.1 to every request, standing in for a Supabase
/// project's `/auth/v1/.well-known/jwks.json`; returns its URL.
fn serve_jwks(document: String) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!(
        "http://{}/auth/v1/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{document}",
                document.len()
            );
        }
    });
    uri
}

/// A token as Supabase Auth issues them: `aud: authenticated`, living three days (more than
/// the one day other keys may), signed with `key`.
fn supabase_token(
    key: &jsonwebtoken::EncodingKey,
    alg: jsonwebtoken::Algorithm,
    kid: &str,
) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_owned());
    let claims = json!({"sub": USER, "aud": "authenticated", "role": "authenticated",
                        "iss": "https://abcdefghijklmnop.supabase.co/auth/v1",
                        "iat": now, "exp": now + 3 * 86_400});
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

/// `client_auth.supabase: true`, the most common PowerSync setup: the SDK syncs with a token
/// signed with the project's legacy JWT secret (`supabase_jwt_secret`) and with one signed
/// by the project's signing key, fetched from its JWKS (a local server stands in for
/// Supabase through `PSM_TEST_SUPABASE_JWKS_URI`, the override for tests). Both carry
/// `aud: authenticated`, which the configured `audience` does not list, and live three days.
#[test]
fn sdk_syncs_with_supabase_auth_tokens() {
    let ec_private = include_str!("../../../../worker/auth/tests/auth_keys/ec_p256.pem");
    let mut jwk: Value = serde_json::from_str(include_str!(
        "../../../../worker/auth/tests/auth_keys/ec_p256.jwk.json"
    ))
    .unwrap();
    jwk["kid"] = json!("supabase-signing-key");
    jwk["alg"] = json!("ES256");
    let jwks_uri = serve_jwks(json!({"keys": [jwk]}).to_string());
    let legacy_secret = "psm-supabase-legacy-jwt-secret-0123456789";
    let client_auth = format!(
        "client_auth:\n  supabase: true\n  supabase_jwt_secret: {legacy_secret}\n  audience: [{AUDIENCE}]\n"
    );
    let install = PgInstall::pg16().with_env(config::SUPABASE_JWKS_OVERRIDE_ENV, &jwks_uri);
    let rig = Rig::start_with(Rules::Legacy, &client_auth, install);
    let tokens = [
        (
            "the legacy JWT secret",
            supabase_token(
                &jsonwebtoken::EncodingKey::from_secret(legacy_secret.as_bytes()),
                jsonwebtoken::Algorithm::HS256,
                "some-supabase-kid",
            ),
        ),
        (
            "a signing key from the project's JWKS",
            supabase_token(
                &jsonwebtoken::EncodingKey::from_ec_pem(ec_private.as_bytes()).unwrap(),
                jsonwebtoken::Algorithm::ES256,
                "supabase-signing-key",
            ),
        ),
    ];
    for (what, token) in tokens {
        let synced = rig.client().with_env("PSM_TOKEN", &token).run("initial");
        assert_rows(what, &synced["tables"]["tasks"], &rig.expected_tasks());
        assert_no_warnings(&synced, what);
    }
    let status = rig.status();
    assert_eq!(status["config_ignored"], json!([]), "{status}");
}
