//! The `/sync/stream` body (spec §1.3) as typed values.
//!
//! Lenient where the official validator is (unknown fields, `null` for optional fields),
//! strict about the types of what it reads: a wrong `after` would make the server send ops
//! the client already holds, so it is refused rather than guessed.

use serde_json::{Map, Value};

use super::error::SyncError;
use rules::{RequestContext, Subscription};

/// Largest body accepted.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// Most bucket positions one request may carry (the service's bucket limit).
pub const MAX_BUCKET_POSITIONS: usize = 1000;
/// Most stream subscriptions one request may carry.
pub const MAX_SUBSCRIPTIONS: usize = 100;

/// A bucket the client holds and the last op id it has of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPosition {
    /// Bucket name.
    pub name: String,
    /// Ops with `op_id > after` are wanted.
    pub after: u64,
}

/// `streams.subscriptions[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSubscription {
    /// Stream name.
    pub stream: String,
    /// An object, or null.
    pub parameters: Value,
    /// 0..=3, overriding the stream's priority.
    pub override_priority: Option<u8>,
}

/// A parsed `/sync/stream` request body.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncRequest {
    /// Buckets the client holds, in request order.
    pub buckets: Vec<BucketPosition>,
    /// The client's install id (keys write checkpoints).
    pub client_id: Option<String>,
    /// Client parameters: an object (empty when absent or null). Not authenticated.
    pub parameters: Map<String, Value>,
    /// `streams.include_defaults` (true when absent).
    pub include_defaults: bool,
    /// Explicit stream subscriptions.
    pub subscriptions: Vec<StreamSubscription>,
    /// Only logged.
    pub app_metadata: Option<Map<String, Value>>,
    /// `true`: a PUT's `data` is a string holding the row's JSON (every current SDK asks
    /// for it). Otherwise, in NDJSON, the row's object itself (`Encoding::NdjsonNestedData`).
    pub raw_data: Option<bool>,
    /// Ignored by the service; kept for logs.
    pub binary_data: Option<bool>,
}

impl SyncRequest {
    /// Parses a body. An empty body is an empty request (no positions, defaults on).
    pub fn parse(body: &[u8]) -> Result<Self, SyncError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(SyncError::BodyTooLarge {
                bytes: body.len(),
                max: MAX_BODY_BYTES,
            });
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Self::from_value(Value::Object(Map::new()));
        }
        let value: Value = serde_json::from_slice(body).map_err(|e| SyncError::BadBody {
            reason: e.to_string(),
        })?;
        Self::from_value(value)
    }

    /// Reads an already-parsed body.
    pub fn from_value(value: Value) -> Result<Self, SyncError> {
        let Value::Object(mut body) = value else {
            return Err(SyncError::BadBody {
                reason: format!("found {}", kind(&value)),
            });
        };
        let buckets = match take(&mut body, "buckets") {
            None => Vec::new(),
            Some(Value::Array(items)) => positions(items)?,
            Some(other) => return Err(expected("buckets", "an array", &other)),
        };
        let client_id = optional_string(&mut body, "client_id")?;
        let parameters = optional_object(&mut body, "parameters")?.unwrap_or_default();
        let (include_defaults, subscriptions) = match take(&mut body, "streams") {
            None => (true, Vec::new()),
            Some(Value::Object(streams)) => streams_of(streams)?,
            Some(other) => return Err(expected("streams", "an object", &other)),
        };
        Ok(Self {
            buckets,
            client_id,
            parameters,
            include_defaults,
            subscriptions,
            app_metadata: optional_object(&mut body, "app_metadata")?,
            raw_data: optional_bool(&mut body, "raw_data")?,
            binary_data: optional_bool(&mut body, "binary_data")?,
        })
    }

    /// The rules' view of this request: the verified token `claims` plus the body's
    /// parameters and subscriptions.
    pub fn context(&self, claims: Value) -> RequestContext {
        let mut ctx = RequestContext::from_claims(claims);
        ctx.parameters = Value::Object(self.parameters.clone());
        ctx.include_defaults = self.include_defaults;
        ctx.subscriptions = self
            .subscriptions
            .iter()
            .map(|s| Subscription {
                stream: s.stream.clone(),
                parameters: s.parameters.clone(),
                override_priority: s.override_priority,
            })
            .collect();
        ctx
    }
}

fn take(body: &mut Map<String, Value>, key: &str) -> Option<Value> {
    body.remove(key).filter(|v| !v.is_null())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn expected(field: impl Into<String>, what: &str, found: &Value) -> SyncError {
    SyncError::field(field, format!("must be {what}, found {}", kind(found)))
}

fn optional_string(body: &mut Map<String, Value>, key: &str) -> Result<Option<String>, SyncError> {
    match take(body, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(expected(key, "a string", &other)),
    }
}

fn optional_bool(body: &mut Map<String, Value>, key: &str) -> Result<Option<bool>, SyncError> {
    match take(body, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(expected(key, "a boolean", &other)),
    }
}

fn optional_object(
    body: &mut Map<String, Value>,
    key: &str,
) -> Result<Option<Map<String, Value>>, SyncError> {
    match take(body, key) {
        None => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(other) => Err(expected(key, "an object or null", &other)),
    }
}

fn positions(items: Vec<Value>) -> Result<Vec<BucketPosition>, SyncError> {
    if items.len() > MAX_BUCKET_POSITIONS {
        return Err(SyncError::TooMany {
            field: "buckets",
            count: items.len(),
            max: MAX_BUCKET_POSITIONS,
        });
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(mut item) = item else {
            return Err(expected(format!("buckets[{i}]"), "an object", &item));
        };
        let name = match take(&mut item, "name") {
            Some(Value::String(s)) => s,
            Some(other) => return Err(expected(format!("buckets[{i}].name"), "a string", &other)),
            None => return Err(SyncError::field(format!("buckets[{i}].name"), "is missing")),
        };
        let after = match take(&mut item, "after") {
            Some(Value::String(s)) => parse_op_id(&s).ok_or_else(|| {
                SyncError::field(
                    format!("buckets[{i}].after"),
                    format!("must be a base-10 op id between 0 and 2^63-1, found {s:?}"),
                )
            })?,
            Some(other) => {
                return Err(expected(
                    format!("buckets[{i}].after"),
                    "a string holding a base-10 op id",
                    &other,
                ))
            }
            None => {
                return Err(SyncError::field(
                    format!("buckets[{i}].after"),
                    "is missing",
                ))
            }
        };
        out.push(BucketPosition { name, after });
    }
    Ok(out)
}

/// A base-10 `i64 ≥ 0` written with digits only (what the client's `DisplayFromStr` emits).
fn parse_op_id(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<i64>().ok().map(|v| v as u64)
}

fn streams_of(
    mut streams: Map<String, Value>,
) -> Result<(bool, Vec<StreamSubscription>), SyncError> {
    let include_defaults = optional_bool(&mut streams, "include_defaults")?.unwrap_or(true);
    let items = match take(&mut streams, "subscriptions") {
        None => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(expected("streams.subscriptions", "an array", &other)),
    };
    if items.len() > MAX_SUBSCRIPTIONS {
        return Err(SyncError::TooMany {
            field: "streams.subscriptions",
            count: items.len(),
            max: MAX_SUBSCRIPTIONS,
        });
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let field = |name: &str| format!("streams.subscriptions[{i}].{name}");
        let Value::Object(mut item) = item else {
            return Err(expected(
                format!("streams.subscriptions[{i}]"),
                "an object",
                &item,
            ));
        };
        let stream = match take(&mut item, "stream") {
            Some(Value::String(s)) => s,
            Some(other) => return Err(expected(field("stream"), "a string", &other)),
            None => return Err(SyncError::field(field("stream"), "is missing")),
        };
        let parameters = match take(&mut item, "parameters") {
            None => Value::Null,
            Some(v @ Value::Object(_)) => v,
            Some(other) => return Err(expected(field("parameters"), "an object or null", &other)),
        };
        let override_priority = match take(&mut item, "override_priority") {
            None => None,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(p @ 0..=3) => Some(p as u8),
                _ => {
                    return Err(SyncError::field(
                        field("override_priority"),
                        format!("must be an integer priority 0..3, found {n}"),
                    ))
                }
            },
            Some(other) => {
                return Err(expected(
                    field("override_priority"),
                    "a number or null",
                    &other,
                ))
            }
        };
        out.push(StreamSubscription {
            stream,
            parameters,
            override_priority,
        });
    }
    Ok((include_defaults, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<SyncRequest, SyncError> {
        SyncRequest::parse(s.as_bytes())
    }

    #[test]
    fn reads_the_sdk_body_and_ignores_unknown_fields() {
        let r = parse(
            r#"{"buckets":[{"name":"1#global[]","after":"1042"},{"name":"b","after":"0","x":1}],
            "include_checksum":true,"raw_data":true,"binary_data":true,"client_id":"c1",
            "parameters":{"p":1},"streams":{"include_defaults":false,"subscriptions":[
            {"stream":"s","parameters":null,"override_priority":1},{"stream":"t"}]},
            "app_metadata":{"k":"v"},"only":["x"],"future":{"a":[]}}"#,
        )
        .unwrap();
        assert_eq!(r.buckets.len(), 2);
        assert_eq!(r.buckets[0].after, 1042);
        assert_eq!(r.client_id.as_deref(), Some("c1"));
        assert!(!r.include_defaults);
        assert_eq!(r.subscriptions[0].override_priority, Some(1));
        assert_eq!(r.subscriptions[1].parameters, Value::Null);
        let ctx = r.context(serde_json::json!({"sub": "u1"}));
        assert_eq!(ctx.user_id.as_deref(), Some("u1"));
        assert_eq!(ctx.parameters, serde_json::json!({"p": 1}));
        assert_eq!(ctx.subscriptions.len(), 2);
        assert!(!ctx.include_defaults);
    }

    #[test]
    fn nulls_and_empty_bodies_are_defaults() {
        for body in [
            "",
            "  ",
            "{}",
            r#"{"buckets":null,"parameters":null,"streams":null,"client_id":null,"app_metadata":null}"#,
        ] {
            let r = parse(body).unwrap();
            assert!(r.buckets.is_empty() && r.include_defaults && r.parameters.is_empty());
        }
        let r = parse(r#"{"streams":{"include_defaults":null,"subscriptions":null}}"#).unwrap();
        assert!(r.include_defaults && r.subscriptions.is_empty());
    }

    #[test]
    fn after_must_be_a_decimal_i64_string() {
        for bad in [
            r#""-1""#,
            r#""1e3""#,
            r#""""#,
            r#"" 1""#,
            r#""+1""#,
            r#""9223372036854775808""#,
            "12",
            "null",
            r#""0x10""#,
        ] {
            let body = format!(r#"{{"buckets":[{{"name":"b","after":{bad}}}]}}"#);
            let e = parse(&body).unwrap_err();
            assert_eq!((e.code(), e.status()), ("PSM_Y1002", 400), "{bad}: {e}");
            assert!(e.to_string().contains("buckets[0].after"), "{e}");
        }
        let r = parse(r#"{"buckets":[{"name":"b","after":"9223372036854775807"}]}"#).unwrap();
        assert_eq!(r.buckets[0].after, i64::MAX as u64);
    }

    #[test]
    fn wrong_types_and_limits_are_refused() {
        for bad in [
            "[]",
            "nope",
            r#"{"buckets":{}}"#,
            r#"{"buckets":[1]}"#,
            r#"{"buckets":[{"after":"1"}]}"#,
            r#"{"parameters":[1]}"#,
            r#"{"client_id":5}"#,
            r#"{"streams":{"subscriptions":[{"stream":1}]}}"#,
            r#"{"streams":{"subscriptions":[{"stream":"s","override_priority":7}]}}"#,
            r#"{"streams":{"subscriptions":[{"stream":"s","parameters":"x"}]}}"#,
            r#"{"raw_data":"yes"}"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}: {e}");
        }
        let many: Vec<String> = (0..=MAX_BUCKET_POSITIONS)
            .map(|i| format!(r#"{{"name":"b{i}","after":"0"}}"#))
            .collect();
        let e = parse(&format!(r#"{{"buckets":[{}]}}"#, many.join(","))).unwrap_err();
        assert_eq!(e.code(), "PSM_Y1004");
        let subs: Vec<&str> = (0..=MAX_SUBSCRIPTIONS)
            .map(|_| r#"{"stream":"s"}"#)
            .collect();
        let e = parse(&format!(
            r#"{{"streams":{{"subscriptions":[{}]}}}}"#,
            subs.join(",")
        ))
        .unwrap_err();
        assert_eq!(e.code(), "PSM_Y1004");
        let big = vec![b' '; MAX_BODY_BYTES + 1];
        assert_eq!(SyncRequest::parse(&big).unwrap_err().status(), 413);
    }
}
