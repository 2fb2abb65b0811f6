//! The admin protocol: one JSON object per line. Requests are tagged by `op`, responses
//! by `result`; an error response carries a code, a message and a hint.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AdminError;
use service::StreamInfo;

/// The socket's file name inside the data directory.
pub const SOCKET_NAME: &str = "powersync_mdbx_admin.sock";
/// Longest socket path (`sun_path` holds 108 bytes with the terminating NUL).
pub const MAX_PATH_BYTES: usize = 107;
/// Largest request line.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
/// Largest response line (a store with very many buckets).
pub const MAX_RESPONSE_BYTES: usize = 512 << 20;

/// What a backend asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Every stored bucket with its accumulators.
    Buckets,
    /// The bucket set of a request with these claims and this `/sync/stream` body.
    UserBuckets {
        /// The JWT payload (`sub` is the user id).
        claims: Value,
        /// A `/sync/stream` body: `parameters`, `streams`; `{}` when absent.
        #[serde(default)]
        request: Value,
    },
    /// The open `/sync/stream` connections.
    Streams,
}

/// One stored bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketRow {
    /// Full bucket name.
    pub bucket: String,
    /// Ops in the bucket.
    pub ops: u64,
    /// Sum of op checksums mod 2^32.
    pub checksum: u32,
    /// Largest op id in the bucket.
    pub last_op_id: u64,
}

/// One bucket of a request's set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserBucketRow {
    /// Full bucket name.
    pub bucket: String,
    /// Effective priority.
    pub priority: u8,
    /// The definition or stream it comes from.
    pub source: String,
    /// Ops in the bucket (0 for a bucket without ops).
    pub ops: u64,
    /// Sum of op checksums mod 2^32.
    pub checksum: u32,
    /// Largest op id in the bucket.
    pub last_op_id: u64,
}

/// What the engine answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum AdminResponse {
    /// Answer to [`AdminRequest::Buckets`].
    Buckets {
        /// The checkpoint read.
        op_id: u64,
        /// In name order.
        buckets: Vec<BucketRow>,
    },
    /// Answer to [`AdminRequest::UserBuckets`].
    UserBuckets {
        /// The checkpoint read.
        op_id: u64,
        /// In resolution order.
        buckets: Vec<UserBucketRow>,
        /// Subscription problems: `[stream, message]`.
        errors: Vec<(String, String)>,
    },
    /// Answer to [`AdminRequest::Streams`].
    Streams {
        /// Oldest first.
        streams: Vec<StreamInfo>,
    },
    /// The request failed.
    Error {
        /// Stable code.
        code: String,
        /// What went wrong.
        message: String,
        /// What to do.
        hint: String,
    },
}

impl AdminResponse {
    /// An error response.
    pub fn error(code: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::Error {
            code: code.to_owned(),
            message: message.into(),
            hint: hint.into(),
        }
    }
}

/// A value as one line: JSON and `\n`.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut line = serde_json::to_vec(value).unwrap_or_else(|e| {
        serde_json::to_vec(&AdminResponse::error(
            "PSM_A1007",
            format!("cannot encode: {e}"),
            "report this as a bug",
        ))
        .unwrap_or_default()
    });
    line.push(b'\n');
    line
}

/// A line (with or without its `\n`) as a value.
pub fn decode<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, AdminError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    serde_json::from_slice(line).map_err(|e| AdminError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_round_trip_as_one_tagged_line() {
        let requests = [
            AdminRequest::Buckets,
            AdminRequest::Streams,
            AdminRequest::UserBuckets {
                claims: json!({"sub": "u1"}),
                request: json!({"parameters": {"a": 1}}),
            },
        ];
        for request in requests {
            let line = encode(&request);
            assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(decode::<AdminRequest>(&line).unwrap(), request);
        }
        assert_eq!(
            String::from_utf8(encode(&AdminRequest::Buckets)).unwrap(),
            "{\"op\":\"buckets\"}\n"
        );
    }

    #[test]
    fn the_request_body_defaults_to_null_and_unknown_ops_are_refused() {
        let r: AdminRequest = decode(br#"{"op":"user_buckets","claims":{"sub":"u"}}"#).unwrap();
        assert_eq!(
            r,
            AdminRequest::UserBuckets {
                claims: json!({"sub": "u"}),
                request: Value::Null
            }
        );
        let err = decode::<AdminRequest>(br#"{"op":"drop_everything"}"#).unwrap_err();
        assert!(err.to_string().starts_with("PSM_A1007"), "{err}");
        assert!(decode::<AdminRequest>(b"not json").is_err());
    }

    #[test]
    fn responses_round_trip() {
        let responses = [
            AdminResponse::Buckets {
                op_id: 9,
                buckets: vec![BucketRow {
                    bucket: "1#global[]".into(),
                    ops: 2,
                    checksum: u32::MAX,
                    last_op_id: 9,
                }],
            },
            AdminResponse::UserBuckets {
                op_id: 9,
                buckets: vec![UserBucketRow {
                    bucket: "1#by_list[\"l1\"]".into(),
                    priority: 3,
                    source: "by_list".into(),
                    ops: 0,
                    checksum: 0,
                    last_op_id: 0,
                }],
                errors: vec![("s".into(), "unknown stream".into())],
            },
            AdminResponse::Streams {
                streams: vec![StreamInfo {
                    id: 1,
                    user_id: "u1".into(),
                    client_id: None,
                    started_at_ms: 1,
                    token_expires_at: 2,
                    last_op_id: Some(3),
                    last_checkpoint_at_ms: Some(4),
                    buckets: 5,
                }],
            },
            AdminResponse::error("PSM_A1007", "bad", "fix it"),
        ];
        for response in responses {
            assert_eq!(
                decode::<AdminResponse>(&encode(&response)).unwrap(),
                response
            );
        }
    }
}
