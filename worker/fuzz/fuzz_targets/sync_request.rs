//! `/sync/stream` request bodies: `service::SyncRequest::parse` on arbitrary bytes, and a
//! body that parses resolved against the fixture's sync streams as the service does.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use rules::{InMemoryLookups, SyncRules};
use service::SyncRequest;

static RULES: LazyLock<SyncRules> = LazyLock::new(|| {
    SyncRules::parse(powersync_mdbx_fuzz::FIXTURE_STREAMS).expect("the fixture's rules compile")
});

fuzz_target!(|body: &[u8]| {
    let Ok(request) = SyncRequest::parse(body) else {
        return;
    };
    let ctx = request.context(serde_json::json!({"sub": "user-1", "iat": 0, "exp": 1}));
    let _ = RULES.resolve_request(&ctx, &InMemoryLookups::new());
});
