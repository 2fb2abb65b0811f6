//! The stream runs on a runtime of its own, one worker thread named `psm-stream`
//! (`own_runtime`), not on the engine's runtime beside the HTTP server: one such thread
//! while the engine streams, none once it stopped, one again after a restart. Its own test
//! binary, so that no other engine's threads are counted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

extern crate powersync_mdbx_engine as engine;

#[path = "engine_rig.rs"]
mod engine_rig;

use engine_rig::{EngineRig, TODOS_RULES, TODOS_SCHEMA};
use testkit::wait_for;

/// This process's threads named `name` (a thread's name is cut to 15 bytes).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

fn wait_for_stream_threads(count: usize) {
    wait_for(
        &format!("{count} thread(s) named psm-stream"),
        || match threads_named("psm-stream") {
            n if n == count => Ok(()),
            n => Err(n),
        },
    );
}

#[test]
fn the_stream_has_one_thread_of_its_own_while_it_streams() {
    let mut rig = EngineRig::start(TODOS_SCHEMA, TODOS_RULES, "psm_stream_thread");
    rig.primary
        .sql("UPDATE todos SET title = title || '!' WHERE id = 't1'");
    wait_for_stream_threads(1);
    rig.stop();
    wait_for_stream_threads(0);
    rig.start_with_rules(TODOS_RULES);
    rig.wait_phase(status::Phase::Streaming);
    wait_for_stream_threads(1);
}
