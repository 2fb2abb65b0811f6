//! `/sync/stream` request bodies: `service::SyncRequest::parse` on arbitrary bytes (with
//! its caps on what a stream keeps), a body that parses kept as a stream keeps it
//! (`service::KeptRequest`, which must read back as it was), and resolved against the
//! fixture's sync streams as the service does.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use rules::{InMemoryLookups, SyncRules};
use service::{KeptRequest, SyncRequest};

static RULES: LazyLock<SyncRules> = LazyLock::new(|| {
    SyncRules::parse(powersync_mdbx_fuzz::FIXTURE_STREAMS).expect("the fixture's rules compile")
});

fuzz_target!(|body: &[u8]| {
    let Ok(request) = SyncRequest::parse(body) else {
        return;
    };
    let ctx = request.context(serde_json::json!({"sub": "user-1", "iat": 0, "exp": 1}));
    let mut base = ctx.clone();
    let kept = KeptRequest::keep(&mut base);
    assert_eq!(kept.context(&base), ctx, "a kept request reads back as it was");
    let _ = RULES.resolve_request(&ctx, &InMemoryLookups::new());
});
