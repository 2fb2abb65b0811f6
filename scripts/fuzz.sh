#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers of outside input (worker/fuzz/README.md).
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Runs each target (all by default) for the given time (600 s by default) with libFuzzer
# through `cargo +nightly fuzz`, one after the other, seeded by the corpus committed in
# worker/fuzz/corpus/<target>. New inputs go to worker/fuzz/target/corpus/<target> (not committed; see
# worker/fuzz/README.md to minimise them into the committed corpus). Fails, naming the input that
# reproduces it, when a target crashes (panic, sanitizer report), leaks, runs out of
# memory or hangs. Installs cargo-fuzz when missing; fails when the nightly toolchain is
# missing (libFuzzer's instrumentation needs it). PSM_FUZZ_TIMEOUT_S (10) and
# PSM_FUZZ_RSS_LIMIT_MB (2048) override the per-input time and memory limits.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root/worker/fuzz"

# Exact: the cargo-fuzz these targets and this script were run with.
CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS=(sync_request sync_socket admin_protocol copy_text pgoutput rules_yaml rules_sql jwt)
# One input running longer than this many seconds is a hang.
TIMEOUT_SECONDS="${PSM_FUZZ_TIMEOUT_S:-10}"
# A target whose memory passes this many MB is a failure (the targets peak near 650 MB).
RSS_LIMIT_MB="${PSM_FUZZ_RSS_LIMIT_MB:-2048}"

seconds="${1:-600}"
[[ $# -gt 0 ]] && shift
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${ALL_TARGETS[@]}")
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -lt 1 ]]; then
  echo "usage: scripts/fuzz.sh [seconds-per-target] [target...]" >&2
  exit 2
fi
for t in "${targets[@]}"; do
  if [[ ! " ${ALL_TARGETS[*]} " == *" $t "* ]]; then
    echo "unknown fuzz target '$t' (targets: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done

if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "FAIL: the nightly Rust toolchain is missing; cargo-fuzz needs it for libFuzzer's" >&2
  echo "instrumentation. Install it with: rustup toolchain install nightly" >&2
  exit 1
fi
if [[ "$(cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
  echo "==> installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

echo "==> building the fuzz targets (nightly, sanitizer and coverage instrumentation)"
# cargo-fuzz looks for `fuzz/` beside the workspace's manifest unless told: this one is
# worker/fuzz, the folder we stand in.
nice -n 10 cargo +nightly fuzz build -O --fuzz-dir .

mkdir -p target/fuzz-logs
failed=()
for t in "${targets[@]}"; do
  work="target/corpus/$t"
  artifacts="artifacts/$t"
  log="target/fuzz-logs/$t.log"
  mkdir -p "$work" "$artifacts"
  args=(-max_total_time="$seconds" -timeout="$TIMEOUT_SECONDS" -rss_limit_mb="$RSS_LIMIT_MB"
    -malloc_limit_mb="$RSS_LIMIT_MB" -print_final_stats=1 -artifact_prefix="$artifacts/")
  [[ -f "dict/$t.dict" ]] && args+=(-dict="dict/$t.dict")
  echo "==> fuzz $t for ${seconds}s (log: worker/fuzz/$log)"
  status=0
  nice -n 10 cargo +nightly fuzz run -O --fuzz-dir . "$t" "$work" "corpus/$t" -- "${args[@]}" >"$log" 2>&1 || status=$?
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
  if [[ $status -ne 0 ]]; then
    input="$(grep -oE '(Test unit written to|artifact_prefix.*; Test unit written to) [^ ]+' "$log" | awk '{print $NF}' | tail -n 1)"
    echo "FAIL: fuzz target $t exited with $status; the input that reproduces it: worker/fuzz/${input:-(see log)}" >&2
    grep -E 'panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|SUMMARY' "$log" | head -n 5 >&2 || true
    echo "reproduce: (cd worker/fuzz && cargo +nightly fuzz run -O --fuzz-dir . $t ${input:-<input>})" >&2
    failed+=("$t")
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAIL: fuzz targets failed: ${failed[*]} (logs in worker/fuzz/target/fuzz-logs)" >&2
  exit 1
fi
echo "==> fuzzing passed: ${targets[*]} (${seconds}s each)"
