//! The streaming lines of `/sync/stream` (`docs/spec/protocol.md` §2) and their two encodings.
//!
//! Wire rules the client enforces (`docs/spec/protocol.md` §2.1, §2.8, §11): one top-level key per
//! line; op ids and positions as decimal strings; op checksums as unsigned u32, bucket checksums in
//! the service's signed i32 form; `data` as a JSON string; MOVE/CLEAR carry only op id, op and
//! checksum; REMOVE carries the PUT's subkey and no data.

use super::emit::{Emitter, Encoding, Key};
use rules::BucketReason;
use store::{OpKind, OpRead};

/// One bucket's entry in `checkpoint.buckets` / `checkpoint_diff.updated_buckets`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketChecksum {
    /// Bucket name.
    pub bucket: String,
    /// Sum of op checksums up to the checkpoint, mod 2^32 (sent as signed i32).
    pub checksum: u32,
    /// Ops up to the checkpoint (progress only).
    pub count: u64,
    /// 0..=3, lower first.
    pub priority: u8,
    /// Why the bucket is synced: `{"default": i}` / `{"sub": i}`.
    pub subscriptions: Vec<BucketReason>,
}

/// A problem of one subscription, shown in `checkpoint.streams[].errors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The subscription index, or `None` for the default subscription.
    pub subscription: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// One entry of `checkpoint.streams`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamDescription {
    /// Definition or stream name.
    pub name: String,
    /// Synced without a subscription.
    pub is_default: bool,
    /// Subscription problems.
    pub errors: Vec<StreamError>,
}

/// A full checkpoint: resets the client's view of its bucket set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointLine {
    /// The checkpoint op id.
    pub last_op_id: u64,
    /// The user's write checkpoint visible at it, if any.
    pub write_checkpoint: Option<u64>,
    /// Every bucket of the user.
    pub buckets: Vec<BucketChecksum>,
    /// Every definition/stream the connection syncs.
    pub streams: Vec<StreamDescription>,
}

/// Changes since the last checkpoint sent on this connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointDiffLine {
    /// The checkpoint op id.
    pub last_op_id: u64,
    /// The user's write checkpoint visible at it, if any.
    pub write_checkpoint: Option<u64>,
    /// New buckets and buckets whose checksum, count, priority or reasons changed.
    pub updated_buckets: Vec<BucketChecksum>,
    /// Buckets that left the user's set.
    pub removed_buckets: Vec<String>,
}

/// A chunk of one bucket's ops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLine {
    /// Bucket name.
    pub bucket: String,
    /// Exclusive start of the chunk.
    pub after: u64,
    /// Op id of the chunk's last op.
    pub next_after: u64,
    /// More ops of this bucket follow for this checkpoint.
    pub has_more: bool,
    /// The ops, ascending.
    pub ops: Vec<OpRead>,
}

/// One line of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncLine {
    /// `checkpoint`.
    Checkpoint(CheckpointLine),
    /// `checkpoint_diff`.
    CheckpointDiff(CheckpointDiffLine),
    /// `data`.
    Data(DataLine),
    /// `checkpoint_complete`.
    CheckpointComplete {
        /// The completed checkpoint.
        last_op_id: u64,
    },
    /// `partial_checkpoint_complete`: every bucket with priority ≤ `priority` is complete.
    PartialCheckpointComplete {
        /// The checkpoint.
        last_op_id: u64,
        /// The completed priority.
        priority: u8,
    },
    /// `token_expires_in`: seconds until the token's `exp` (the keepalive).
    TokenExpiresIn(i32),
}

impl SyncLine {
    /// Appends the encoded line to `out` (a reusable buffer).
    pub fn encode(&self, encoding: Encoding, out: &mut Vec<u8>) {
        let mut e = Emitter::begin(out, encoding);
        match self {
            Self::Checkpoint(c) => {
                e.object(Key::Name("checkpoint"));
                e.op_id(Key::Name("last_op_id"), c.last_op_id);
                if let Some(w) = c.write_checkpoint {
                    e.op_id(Key::Name("write_checkpoint"), w);
                }
                bucket_list(&mut e, "buckets", &c.buckets);
                e.array(Key::Name("streams"));
                for s in &c.streams {
                    stream(&mut e, s);
                }
                e.end_array();
                e.end_object();
            }
            Self::CheckpointDiff(d) => {
                e.object(Key::Name("checkpoint_diff"));
                e.op_id(Key::Name("last_op_id"), d.last_op_id);
                if let Some(w) = d.write_checkpoint {
                    e.op_id(Key::Name("write_checkpoint"), w);
                }
                bucket_list(&mut e, "updated_buckets", &d.updated_buckets);
                e.array(Key::Name("removed_buckets"));
                for name in &d.removed_buckets {
                    e.str(Key::Elem, name);
                }
                e.end_array();
                e.end_object();
            }
            Self::Data(d) => {
                e.object(Key::Name("data"));
                e.str(Key::Name("bucket"), &d.bucket);
                e.op_id(Key::Name("after"), d.after);
                e.op_id(Key::Name("next_after"), d.next_after);
                e.bool(Key::Name("has_more"), d.has_more);
                e.array(Key::Name("data"));
                for op in &d.ops {
                    op_entry(&mut e, op);
                }
                e.end_array();
                e.end_object();
            }
            Self::CheckpointComplete { last_op_id } => {
                e.object(Key::Name("checkpoint_complete"));
                e.op_id(Key::Name("last_op_id"), *last_op_id);
                e.end_object();
            }
            Self::PartialCheckpointComplete {
                last_op_id,
                priority,
            } => {
                e.object(Key::Name("partial_checkpoint_complete"));
                e.op_id(Key::Name("last_op_id"), *last_op_id);
                e.int32(Key::Name("priority"), i32::from(*priority));
                e.end_object();
            }
            Self::TokenExpiresIn(seconds) => e.int32(Key::Name("token_expires_in"), *seconds),
        }
        e.end();
    }

    /// The encoded line in a new buffer.
    pub fn to_bytes(&self, encoding: Encoding) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(encoding, &mut out);
        out
    }
}

fn bucket_list(e: &mut Emitter<'_>, key: &str, buckets: &[BucketChecksum]) {
    e.array(Key::Name(key));
    for b in buckets {
        e.object(Key::Elem);
        e.str(Key::Name("bucket"), &b.bucket);
        // The service's form: `(x) & 0xffffffff` in JS is a signed 32-bit value.
        e.int64(Key::Name("checksum"), i64::from(b.checksum as i32));
        e.int64(Key::Name("count"), b.count as i64);
        e.int32(Key::Name("priority"), i32::from(b.priority));
        e.array(Key::Name("subscriptions"));
        for reason in &b.subscriptions {
            e.object(Key::Elem);
            match reason {
                BucketReason::Default(i) => e.int64(Key::Name("default"), *i as i64),
                BucketReason::Subscription(i) => e.int64(Key::Name("sub"), *i as i64),
            }
            e.end_object();
        }
        e.end_array();
        e.end_object();
    }
    e.end_array();
}

fn stream(e: &mut Emitter<'_>, s: &StreamDescription) {
    e.object(Key::Elem);
    e.str(Key::Name("name"), &s.name);
    e.bool(Key::Name("is_default"), s.is_default);
    e.array(Key::Name("errors"));
    for err in &s.errors {
        e.object(Key::Elem);
        match err.subscription {
            None => e.str(Key::Name("subscription"), "default"),
            // An int32 in BSON, as the official service sends it: the official client
            // refuses an int64 here (the whole line, and the connection, fail).
            Some(i) => e.int32(
                Key::Name("subscription"),
                i32::try_from(i).unwrap_or(i32::MAX),
            ),
        }
        e.str(Key::Name("message"), &err.message);
        e.end_object();
    }
    e.end_array();
    e.end_object();
}

fn op_entry(e: &mut Emitter<'_>, op: &OpRead) {
    e.object(Key::Elem);
    e.op_id(Key::Name("op_id"), op.op_id);
    e.str(
        Key::Name("op"),
        match op.kind {
            OpKind::Put => "PUT",
            OpKind::Remove => "REMOVE",
            OpKind::Move => "MOVE",
            OpKind::Clear => "CLEAR",
        },
    );
    if let (Some(o), OpKind::Put | OpKind::Remove) = (&op.object, op.kind) {
        e.str(Key::Name("object_type"), &o.object_type);
        e.str(Key::Name("object_id"), &o.object_id);
        e.str(Key::Name("subkey"), &o.subkey);
        if op.kind == OpKind::Put {
            let data = o.data.as_deref().unwrap_or("{}");
            if e.nested_data {
                e.raw_json(Key::Name("data"), data);
            } else {
                e.str(Key::Name("data"), data);
            }
        }
    }
    // Unsigned, as the service sends PUT/REMOVE checksums (a CLEAR's sum is the same
    // value mod 2^32, which the client accepts in either form).
    e.int64(Key::Name("checksum"), i64::from(op.checksum));
    e.end_object();
}

#[cfg(test)]
mod tests;
