//! Claim checks on a verified payload: times with clock tolerance, lifetime, audience,
//! issuer, `parameters`, and the user id from `sub`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::error::AuthError;

/// What a payload must satisfy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimPolicy<'a> {
    /// Accepted `aud` values; empty refuses every token.
    pub audience: &'a [String],
    /// Required `iss`.
    pub issuer: Option<&'a str>,
    /// Largest `exp - iat`.
    pub max_lifetime: Duration,
    /// Tolerance for `exp` and `nbf`.
    pub clock_skew: Duration,
}

/// What the claims yield.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Checked {
    /// `sub` as text.
    pub user_id: String,
    /// `exp` as a time.
    pub expires_at: SystemTime,
}

/// Checks `payload` at `now`.
pub(crate) fn check(
    payload: &Map<String, Value>,
    policy: &ClaimPolicy<'_>,
    now: SystemTime,
) -> Result<Checked, AuthError> {
    let now = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let skew = policy.clock_skew.as_secs_f64();

    let exp = numeric_date(payload, "exp")?.ok_or(AuthError::MissingClaim { claim: "exp" })?;
    let iat = numeric_date(payload, "iat")?.ok_or(AuthError::MissingClaim { claim: "iat" })?;
    let user_id = user_id(payload.get("sub"))?;
    if exp <= now - skew {
        return Err(AuthError::Expired { exp: exp as i64 });
    }
    if let Some(nbf) = numeric_date(payload, "nbf")? {
        if nbf > now + skew {
            return Err(AuthError::NotYetValid { nbf: nbf as i64 });
        }
    }
    // The official service checks `exp - iat` alone (its JWT library checks `iat` only
    // when asked for a token age, which it does not ask), so a token issued "in ten years"
    // and expiring an hour after passes there, though it stays valid for ten years. Here
    // an `iat` ahead of now counts from now: what the check means, that a token expires
    // within the lifetime. The same refusal (`PSYNC_S2104`) and message.
    let lifetime = exp - iat.min(now);
    if lifetime > policy.max_lifetime.as_secs_f64() {
        return Err(AuthError::LifetimeTooLong {
            lifetime: lifetime as i64,
            max: policy.max_lifetime.as_secs(),
        });
    }
    check_audience(payload.get("aud"), policy.audience)?;
    if let Some(issuer) = policy.issuer {
        if payload.get("iss").and_then(Value::as_str) != Some(issuer) {
            return Err(AuthError::IssuerMismatch);
        }
    }
    match payload.get("parameters") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(_) => return Err(AuthError::InvalidParameters),
    }
    let expires_at = Duration::try_from_secs_f64(exp)
        .ok()
        .and_then(|d| UNIX_EPOCH.checked_add(d))
        .ok_or(AuthError::InvalidClaim {
            claim: "exp",
            problem: "is not a representable time",
        })?;
    Ok(Checked {
        user_id,
        expires_at,
    })
}

/// A NumericDate claim (seconds since the epoch, finite, not negative).
fn numeric_date(
    payload: &Map<String, Value>,
    claim: &'static str,
) -> Result<Option<f64>, AuthError> {
    match payload.get(claim) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(v) if v.is_finite() && v >= 0.0 => Ok(Some(v)),
            _ => Err(AuthError::InvalidClaim {
                claim,
                problem: "is not a valid NumericDate (seconds since 1970)",
            }),
        },
        Some(_) => Err(AuthError::InvalidClaim {
            claim,
            problem: "must be a number (seconds since 1970)",
        }),
    }
}

/// `sub` as text: a non-empty string, or a number's decimal text.
fn user_id(sub: Option<&Value>) -> Result<String, AuthError> {
    match sub {
        None | Some(Value::Null) => Err(AuthError::MissingClaim { claim: "sub" }),
        Some(Value::String(s)) if s.is_empty() => Err(AuthError::InvalidClaim {
            claim: "sub",
            problem: "is empty",
        }),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(match n.as_f64() {
            // Integral floats print like JavaScript's String(1.0) == "1".
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => {
                format!("{}", f as i64)
            }
            _ => n.to_string(),
        }),
        Some(_) => Err(AuthError::InvalidClaim {
            claim: "sub",
            problem: "must be a string or a number",
        }),
    }
}

fn check_audience(aud: Option<&Value>, accepted: &[String]) -> Result<(), AuthError> {
    if accepted.is_empty() {
        return Err(AuthError::AudienceNotConfigured);
    }
    let accepts = |v: &Value| v.as_str().is_some_and(|s| accepted.iter().any(|a| a == s));
    match aud {
        None | Some(Value::Null) => Err(AuthError::MissingAudience),
        Some(Value::Array(list)) if list.iter().any(accepts) => Ok(()),
        Some(one @ Value::String(_)) if accepts(one) => Ok(()),
        Some(_) => Err(AuthError::AudienceMismatch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_700_000_000;

    fn audience() -> Vec<String> {
        vec!["https://sync.example".to_owned(), "other".to_owned()]
    }

    fn run(payload: Value, issuer: Option<&str>) -> Result<Checked, AuthError> {
        let audience = audience();
        let policy = ClaimPolicy {
            audience: &audience,
            issuer,
            max_lifetime: Duration::from_secs(86_400),
            clock_skew: Duration::from_secs(60),
        };
        let Value::Object(map) = payload else {
            panic!("test payload must be an object")
        };
        check(&map, &policy, UNIX_EPOCH + Duration::from_secs(NOW))
    }

    fn valid() -> Value {
        json!({
            "sub": "u1",
            "iat": NOW - 10,
            "exp": NOW + 600,
            "aud": "https://sync.example"
        })
    }

    fn with(key: &str, value: Value) -> Value {
        let mut p = valid();
        p[key] = value;
        p
    }

    fn without(key: &str) -> Value {
        let mut p = valid();
        p.as_object_mut().map(|m| m.remove(key));
        p
    }

    #[test]
    fn valid_payload() {
        let checked = run(valid(), None).unwrap();
        assert_eq!(checked.user_id, "u1");
        assert_eq!(
            checked.expires_at,
            UNIX_EPOCH + Duration::from_secs(NOW + 600)
        );
    }

    #[test]
    fn required_claims() {
        for claim in ["sub", "iat", "exp"] {
            assert_eq!(
                run(without(claim), None),
                Err(AuthError::MissingClaim { claim }),
                "{claim}"
            );
        }
        assert_eq!(run(without("aud"), None), Err(AuthError::MissingAudience));
    }

    #[test]
    fn expiry_with_tolerance() {
        assert!(run(with("exp", json!(NOW - 30)), None).is_ok());
        assert_eq!(
            run(with("exp", json!(NOW - 60)), None),
            Err(AuthError::Expired {
                exp: (NOW - 60) as i64
            })
        );
        assert!(run(with("nbf", json!(NOW + 30)), None).is_ok());
        assert!(matches!(
            run(with("nbf", json!(NOW + 61)), None),
            Err(AuthError::NotYetValid { .. })
        ));
    }

    #[test]
    fn lifetime_limit() {
        let mut p = valid();
        p["iat"] = json!(NOW - 100);
        p["exp"] = json!(NOW - 100 + 86_400);
        assert!(run(p.clone(), None).is_ok());
        p["exp"] = json!(NOW - 100 + 86_401);
        assert_eq!(
            run(p, None),
            Err(AuthError::LifetimeTooLong {
                lifetime: 86_401,
                max: 86_400
            })
        );
    }

    #[test]
    fn a_token_issued_in_the_future_counts_its_lifetime_from_now() {
        let ten_years = 10 * 365 * 86_400;
        let mut p = valid();
        p["iat"] = json!(NOW + ten_years);
        p["exp"] = json!(NOW + ten_years + 300);
        assert_eq!(
            run(p.clone(), None),
            Err(AuthError::LifetimeTooLong {
                lifetime: (ten_years + 300) as i64,
                max: 86_400
            })
        );
        // An issuer's clock a little ahead: the lifetime from now is still short.
        p["iat"] = json!(NOW + 30);
        p["exp"] = json!(NOW + 30 + 3_600);
        assert!(run(p, None).is_ok());
    }

    #[test]
    fn audience_forms() {
        assert!(run(with("aud", json!(["x", "other"])), None).is_ok());
        for aud in [json!("x"), json!(["x", 1]), json!(5), json!([])] {
            assert_eq!(
                run(with("aud", aud.clone()), None),
                Err(AuthError::AudienceMismatch),
                "{aud}"
            );
        }
        let policy = ClaimPolicy {
            audience: &[],
            issuer: None,
            max_lifetime: Duration::from_secs(86_400),
            clock_skew: Duration::from_secs(60),
        };
        let Value::Object(map) = valid() else {
            panic!()
        };
        assert_eq!(
            check(&map, &policy, UNIX_EPOCH + Duration::from_secs(NOW)),
            Err(AuthError::AudienceNotConfigured)
        );
    }

    #[test]
    fn issuer() {
        assert!(run(with("iss", json!("me")), Some("me")).is_ok());
        assert_eq!(run(valid(), Some("me")), Err(AuthError::IssuerMismatch));
        assert_eq!(
            run(with("iss", json!("you")), Some("me")),
            Err(AuthError::IssuerMismatch)
        );
    }

    #[test]
    fn parameters_must_be_an_object() {
        assert!(run(with("parameters", json!({"a": 1})), None).is_ok());
        assert!(run(with("parameters", Value::Null), None).is_ok());
        for bad in [json!([1]), json!("x"), json!(1), json!(true)] {
            assert_eq!(
                run(with("parameters", bad), None),
                Err(AuthError::InvalidParameters)
            );
        }
    }

    #[test]
    fn sub_forms() {
        assert_eq!(run(with("sub", json!(42)), None).unwrap().user_id, "42");
        assert_eq!(run(with("sub", json!(42.0)), None).unwrap().user_id, "42");
        assert_eq!(run(with("sub", json!(1.5)), None).unwrap().user_id, "1.5");
        for bad in [json!(""), json!(true), json!({}), json!([])] {
            assert!(matches!(
                run(with("sub", bad), None),
                Err(AuthError::InvalidClaim { claim: "sub", .. })
            ));
        }
    }

    #[test]
    fn bad_dates() {
        for bad in [json!("soon"), json!(-1), json!(1e300)] {
            assert!(
                matches!(
                    run(with("exp", bad.clone()), None),
                    Err(AuthError::InvalidClaim { claim: "exp", .. }
                        | AuthError::LifetimeTooLong { .. })
                ),
                "{bad}"
            );
        }
    }
}
