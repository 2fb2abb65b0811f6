//! What the WebSocket transport and `POST /sync/checkpoint-request` read from the network
//! (first byte even: an RSocket frame, its SETUP / REQUEST_STREAM metadata, and a stream's
//! data parsed as the sync request it carries; odd: a checkpoint-request body). An
//! accepted checkpoint request has an id between 1 and i64::MAX.
#![no_main]

use libfuzzer_sys::fuzz_target;
use service::SyncRequest;

fuzz_target!(|input: &[u8]| {
    let Some((&selector, rest)) = input.split_first() else {
        return;
    };
    if selector % 2 == 0 {
        if let Some(data) = http::fuzzing::websocket_frame(rest) {
            let _ = SyncRequest::parse(&data);
        }
    } else if let Some((_client, id)) = http::fuzzing::checkpoint_request(rest) {
        assert!((1..=i64::MAX as u64).contains(&id), "id {id} out of range");
    }
});
