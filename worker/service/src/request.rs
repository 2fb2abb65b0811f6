//! The `/sync/stream` body (`docs/spec/protocol.md` §1.3) as typed values.
//!
//! Lenient where the official validator is (unknown fields, `null` for optional fields),
//! strict about the types of what it reads: a wrong `after` would make the server send ops
//! the client already holds, so it is refused rather than guessed.
//!
//! What a stream keeps of its request for its whole life (`client_id`, `parameters`,
//! `streams.subscriptions`) is capped in size, and kept as JSON text ([`KeptRequest`]):
//! a replica holds 10,000 streams, and a parsed JSON tree takes up to 16 times its text.

use serde_json::{Map, Value};

use super::error::SyncError;
use rules::{RequestContext, Subscription};

/// Largest body accepted: the official service's (fastify's default `bodyLimit`).
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Longest `client_id` accepted, in bytes (the SDKs send a UUID, 36). A stream keeps it.
pub const MAX_CLIENT_ID_BYTES: usize = 256;
/// Most bytes of `parameters`, as JSON text, accepted. A stream keeps them for its life.
pub const MAX_PARAMETERS_BYTES: usize = 8 << 10;
/// Most bytes of `streams.subscriptions` (the stream names and parameters, as JSON text)
/// accepted. A stream keeps them for its life.
pub const MAX_SUBSCRIPTIONS_BYTES: usize = 8 << 10;
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
        if let Some(id) = &client_id {
            at_most("client_id", id.len(), MAX_CLIENT_ID_BYTES)?;
        }
        let parameters = optional_object(&mut body, "parameters")?.unwrap_or_default();
        at_most("parameters", json_len(&parameters), MAX_PARAMETERS_BYTES)?;
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

/// `value` as compact JSON text (values always serialize).
fn json_text(value: &impl serde::Serialize) -> Box<str> {
    serde_json::to_string(value)
        .unwrap_or_default()
        .into_boxed_str()
}

/// Refuses a kept field of `bytes` over `max`.
fn at_most(field: &'static str, bytes: usize, max: usize) -> Result<(), SyncError> {
    if bytes > max {
        return Err(SyncError::FieldTooLarge { field, bytes, max });
    }
    Ok(())
}

/// The length of `value` as compact JSON text, counted without writing it.
fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot be written counts as none.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// What a stream keeps of its request for its life besides the token: the client
/// parameters and the subscriptions, each as one JSON text rather than parsed trees (one
/// allocation each). They are read back for each resolution of the request
/// ([`Self::context`]); the common request (no parameters, no subscriptions) has nothing to
/// read back.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeptRequest {
    /// `parameters` as JSON text; `None` for an empty object.
    parameters: Option<Box<str>>,
    /// The subscriptions as a JSON array of [`KeptSubscription`]; `None` for none.
    subscriptions: Option<Box<str>>,
}

/// One subscription as the kept text writes it.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptSubscription {
    stream: String,
    parameters: Value,
    override_priority: Option<u8>,
}

impl KeptRequest {
    /// Moves the client parameters and subscriptions of `context` into text, leaving it an
    /// empty object of parameters and no subscriptions.
    pub fn keep(context: &mut RequestContext) -> Self {
        let parameters = std::mem::replace(&mut context.parameters, Value::Object(Map::new()));
        let is_empty = parameters.as_object().is_some_and(Map::is_empty);
        let subscriptions: Vec<KeptSubscription> = std::mem::take(&mut context.subscriptions)
            .into_iter()
            .map(|s| KeptSubscription {
                stream: s.stream,
                parameters: s.parameters,
                override_priority: s.override_priority,
            })
            .collect();
        Self {
            parameters: (!is_empty).then(|| json_text(&parameters)),
            subscriptions: (!subscriptions.is_empty()).then(|| json_text(&subscriptions)),
        }
    }

    /// `base` (a context [`Self::keep`] emptied) with the kept parameters and
    /// subscriptions read back in.
    pub fn context(&self, base: &RequestContext) -> RequestContext {
        let mut context = base.clone();
        // Written by `keep` from values, so they read back.
        if let Some(text) = &self.parameters {
            context.parameters = serde_json::from_str(text).unwrap_or(Value::Null);
        }
        if let Some(text) = &self.subscriptions {
            context.subscriptions = serde_json::from_str::<Vec<KeptSubscription>>(text)
                .unwrap_or_default()
                .into_iter()
                .map(|s| Subscription {
                    stream: s.stream,
                    parameters: s.parameters,
                    override_priority: s.override_priority,
                })
                .collect();
        }
        context
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
    at_most(
        "streams.subscriptions",
        json_len(&items),
        MAX_SUBSCRIPTIONS_BYTES,
    )?;
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
    fn a_kept_request_reads_back_as_it_was() {
        let r = parse(
            r#"{"parameters":{"p":[1,2.5,"x",null,{"n":-3}]},"streams":{"subscriptions":[
            {"stream":"s","parameters":{"a":1,"f":3333333333333333333333333333333333333333.0},"override_priority":2},{"stream":"t"}]}}"#,
        )
        .unwrap();
        let whole = r.context(serde_json::json!({"sub": "u1"}));
        let mut base = whole.clone();
        let kept = KeptRequest::keep(&mut base);
        assert_eq!(base.parameters, serde_json::json!({}));
        assert!(base.subscriptions.is_empty());
        // Every number reads back exactly (the fuzzer found 3.3333333333333336e+39 read
        // back as 3.333333333333333e+39 before serde_json's `float_roundtrip`).
        assert_eq!(kept.context(&base), whole);
        // Nothing to keep: nothing to read back.
        let mut plain = parse("{}")
            .unwrap()
            .context(serde_json::json!({"sub": "u1"}));
        let kept = KeptRequest::keep(&mut plain);
        assert_eq!(kept, KeptRequest::default());
        assert_eq!(kept.context(&plain).parameters, serde_json::json!({}));
    }

    #[test]
    fn what_a_stream_keeps_is_capped() {
        let at = |field: &str, bytes: usize| {
            // A JSON string of `bytes` characters, quotes included.
            let text = format!("\"{}\"", "x".repeat(bytes - 2));
            match field {
                "client_id" => format!(r#"{{"client_id":{text}}}"#),
                "parameters" => format!(r#"{{"parameters":{{"k":{text}}}}}"#),
                _ => format!(r#"{{"streams":{{"subscriptions":[{{"stream":{text}}}]}}}}"#),
            }
        };
        // The JSON text around the string: `{"k":…}` and `[{"stream":…}]`.
        for (field, max, around) in [
            ("client_id", MAX_CLIENT_ID_BYTES + 2, 0),
            ("parameters", MAX_PARAMETERS_BYTES, 6),
            ("streams.subscriptions", MAX_SUBSCRIPTIONS_BYTES, 13),
        ] {
            parse(&at(field, max - around)).unwrap_or_else(|e| panic!("{field}: {e}"));
            let e = parse(&at(field, max - around + 1)).unwrap_err();
            assert_eq!((e.code(), e.status()), ("PSM_Y1005", 400), "{field}: {e}");
            assert!(e.to_string().contains(field), "{e}");
        }
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
