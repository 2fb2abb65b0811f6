//! Admin socket lines: `admin::protocol::decode` for the request and the answer type (the
//! answer carries every row type: buckets, user buckets, streams, errors). A decoded value
//! encodes to a line that decodes again.
#![no_main]

use admin::protocol::{decode, encode, AdminRequest, AdminResponse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    if let Ok(request) = decode::<AdminRequest>(line) {
        decode::<AdminRequest>(&encode(&request)).expect("an encoded request decodes");
    }
    if let Ok(response) = decode::<AdminResponse>(line) {
        decode::<AdminResponse>(&encode(&response)).expect("an encoded answer decodes");
    }
});
