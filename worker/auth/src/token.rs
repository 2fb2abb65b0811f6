//! Taking a token apart: the `Authorization` header, the three JWS segments, the JSON header
//! and payload. Everything here reads attacker-controlled bytes and must fail, not panic.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};

use super::error::{shorten, AuthError};
use super::keys::TokenAlg;

/// Tokens longer than this are refused before any decoding (real ones are a few KiB).
pub(crate) const MAX_TOKEN_BYTES: usize = 64 * 1024;

/// The token from `Token <jwt>` or `Bearer <jwt>` (the service's `^(Token|Bearer) (\S+)$`).
pub(crate) fn from_header(authorization: Option<&str>) -> Result<&str, AuthError> {
    let header = match authorization {
        None | Some("") => return Err(AuthError::MissingToken),
        Some(h) => h,
    };
    let Some((scheme, token)) = header.split_once(' ') else {
        return Err(AuthError::MalformedHeader);
    };
    if !matches!(scheme, "Token" | "Bearer")
        || token.is_empty()
        || token.chars().any(char::is_whitespace)
    {
        return Err(AuthError::MalformedHeader);
    }
    Ok(token)
}

/// A compact JWS whose header has been read; the signature is not yet checked.
#[derive(Debug)]
pub(crate) struct Jwt<'a> {
    /// The header's algorithm.
    pub alg: TokenAlg,
    /// The header's key id.
    pub kid: Option<String>,
    /// `base64(header) . base64(payload)`: the signed bytes.
    pub signed: &'a str,
    /// The base64url signature.
    pub signature: &'a str,
    payload: &'a str,
}

impl<'a> Jwt<'a> {
    /// Splits and reads the header. Refuses `none`, unknown algorithms and `crit`.
    pub(crate) fn parse(token: &'a str) -> Result<Self, AuthError> {
        let malformed = |reason| AuthError::Malformed { reason };
        if token.len() > MAX_TOKEN_BYTES {
            return Err(malformed("it is longer than 64 KiB"));
        }
        let (signed, signature) = token
            .rsplit_once('.')
            .ok_or(malformed("it does not have three dot-separated parts"))?;
        let (header, payload) = signed
            .split_once('.')
            .ok_or(malformed("it does not have three dot-separated parts"))?;
        if payload.contains('.') {
            return Err(malformed("it has more than three dot-separated parts"));
        }
        let header = json_object(header).ok_or(malformed("the header is not base64url JSON"))?;
        let alg = match header.get("alg") {
            Some(Value::String(alg)) => alg,
            _ => return Err(malformed("the header has no `alg`")),
        };
        let alg = TokenAlg::parse(alg).ok_or_else(|| AuthError::UnsupportedAlgorithm {
            alg: shorten(alg, 32),
        })?;
        let kid = match header.get("kid") {
            None | Some(Value::Null) => None,
            Some(Value::String(kid)) => Some(kid.clone()),
            Some(_) => return Err(malformed("the header's `kid` is not a string")),
        };
        if header.contains_key("crit") {
            return Err(malformed(
                "critical header extensions (`crit`) are not supported",
            ));
        }
        match URL_SAFE_NO_PAD.decode(signature) {
            Ok(bytes) if !bytes.is_empty() => {}
            _ => return Err(malformed("the signature is missing or not base64url")),
        }
        Ok(Self {
            alg,
            kid,
            signed,
            signature,
            payload,
        })
    }

    /// The payload object. Read it only after the signature verified.
    pub(crate) fn payload(&self) -> Result<Map<String, Value>, AuthError> {
        json_object(self.payload).ok_or(AuthError::Malformed {
            reason: "the payload is not a base64url JSON object",
        })
    }
}

/// A base64url (unpadded) JSON object, or `None`.
fn json_object(segment: &str) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(segment).ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(text: &str) -> String {
        URL_SAFE_NO_PAD.encode(text)
    }

    fn token(header: &str, payload: &str) -> String {
        format!("{}.{}.{}", b64(header), b64(payload), b64("sig"))
    }

    #[test]
    fn header_schemes() {
        assert_eq!(from_header(Some("Token abc")), Ok("abc"));
        assert_eq!(from_header(Some("Bearer a.b.c")), Ok("a.b.c"));
        assert_eq!(from_header(None), Err(AuthError::MissingToken));
        assert_eq!(from_header(Some("")), Err(AuthError::MissingToken));
        for bad in [
            "Token",
            "Token ",
            "token abc",
            "Basic abc",
            "Bearer  abc",
            "Bearer a b",
            "Bearer abc\n",
            "Bearerabc",
        ] {
            assert_eq!(
                from_header(Some(bad)),
                Err(AuthError::MalformedHeader),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parses_header_fields() {
        let t = token(r#"{"alg":"RS256","kid":"k1","typ":"JWT"}"#, "{}");
        let jwt = Jwt::parse(&t).unwrap();
        assert_eq!(jwt.alg, TokenAlg::Rs256);
        assert_eq!(jwt.kid.as_deref(), Some("k1"));
        assert!(jwt.payload().unwrap().is_empty());
        assert_eq!(jwt.signed.matches('.').count(), 1);
    }

    #[test]
    fn refuses_none_and_unknown_algorithms() {
        for alg in ["none", "None", "PS256", "ES512", "HS1"] {
            let t = token(&format!(r#"{{"alg":"{alg}"}}"#), "{}");
            assert!(
                matches!(Jwt::parse(&t), Err(AuthError::UnsupportedAlgorithm { .. })),
                "{alg}"
            );
        }
    }

    #[test]
    fn malformed_tokens() {
        let ok_header = b64(r#"{"alg":"HS256"}"#);
        for t in [
            String::new(),
            "abc".into(),
            "a.b".into(),
            "a.b.c.d".into(),
            format!("{ok_header}.e30."),
            format!("{ok_header}.e30.@@@"),
            format!("{}.e30.c2ln", b64("[]")),
            format!("{}.e30.c2ln", b64(r#"{"alg":1}"#)),
            format!("{}.e30.c2ln", b64(r#"{"alg":"HS256","kid":5}"#)),
            format!("{}.e30.c2ln", b64(r#"{"alg":"HS256","crit":["b64"]}"#)),
            format!("{ok_header}=.e30.c2ln"),
            "a".repeat(MAX_TOKEN_BYTES + 1),
        ] {
            assert!(
                matches!(Jwt::parse(&t), Err(AuthError::Malformed { .. })),
                "{t:.60}"
            );
        }
        let t = format!("{ok_header}.{}.c2ln", b64("[1]"));
        assert!(Jwt::parse(&t).unwrap().payload().is_err());
    }
}
