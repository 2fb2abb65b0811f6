//! Entry points for the fuzz targets (`worker/fuzz/`), calling what the handlers call on input
//! from the network: a WebSocket's RSocket frames with their metadata, and the body of
//! `POST /sync/checkpoint-request`. Not an API.

use super::rsocket::{self, Inbound};
use super::sync_socket::metadata_field;
use super::write_checkpoint::parse_request;

/// Reads `frame` as the WebSocket transport does, and the metadata fields it looks at.
/// Returns the request's data when the frame is a REQUEST_STREAM (what the stream then
/// parses as a sync request).
pub fn websocket_frame(frame: &[u8]) -> Option<Vec<u8>> {
    match rsocket::read(frame).ok()? {
        Inbound::Setup { metadata, .. } => {
            let _ = metadata_field(&metadata, "token");
            None
        }
        Inbound::RequestStream { metadata, data, .. } => {
            let _ = metadata_field(&metadata, "path");
            Some(data)
        }
        _ => None,
    }
}

/// Parses a checkpoint-request body; returns the client id and request id it accepts.
pub fn checkpoint_request(body: &[u8]) -> Option<(String, u64)> {
    parse_request(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed of the fuzz target's corpus, without its selector byte.
    fn seed(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../fuzz/corpus/sync_socket/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))[1..].to_vec()
    }

    #[test]
    fn the_corpus_seeds_are_frames_and_bodies_the_handlers_accept() {
        assert!(matches!(
            rsocket::read(&seed("setup")),
            Ok(Inbound::Setup { ref metadata, .. }) if metadata_field(metadata, "token").is_some()
        ));
        let data = websocket_frame(&seed("request")).expect("a REQUEST_STREAM");
        service::SyncRequest::parse(&data).expect("its data is a sync request");
        for other in ["request_n", "cancel", "keepalive", "error"] {
            assert!(rsocket::read(&seed(other)).is_ok(), "{other}");
        }
        assert_eq!(
            checkpoint_request(&seed("checkpoint_string")),
            Some(("c1".into(), 42))
        );
        assert_eq!(
            checkpoint_request(&seed("checkpoint_number")).map(|(_, id)| id),
            Some(i64::MAX as u64)
        );
        assert_eq!(checkpoint_request(&seed("checkpoint_zero")), None);
    }
}
