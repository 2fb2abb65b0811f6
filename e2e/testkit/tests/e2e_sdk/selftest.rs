//! The e2e client checked on its own, against a mock service.
use testkit::require_sdk_client;

/// The client itself, against the in-memory mock service of `e2e/selftest/`: a dump, a
/// checksum mismatch and a missing endpoint failing the run, local writes gated by the
/// write checkpoint, reconnects resuming. Needs no server, so a broken harness shows up
/// apart from server bugs.
#[test]
fn sdk_client_selftest_against_a_mock_service() {
    let (node, script) = require_sdk_client();
    let selftest = script.with_file_name("selftest").join("run.mjs");
    let out = std::process::Command::new(node)
        .arg(selftest)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "e2e client self-test failed:\n{text}");
    assert!(text.contains(" passed, 0 failed"), "{text}");
}
