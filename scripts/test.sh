#!/usr/bin/env bash
# The one test command: prepares the machine (idempotent), then runs the format check,
# the crate-graph, documentation and layout checks, clippy with warnings denied, installs the
# extension into PostgreSQL 16 and runs every crate's tests (unit, in-process engine, live
# clusters); then the primary matrix: the replication crate's live tests and the official
# SDK's against PostgreSQL 14, 17 and 18 primaries (scripts/matrix.sh; 13 is refused, which
# the source crate's tests check); then builds the extension for Debian's PostgreSQL 15 and
# runs the extension's live tests (testkit) there too; last, a short coverage-guided fuzzing pass of every
# parser of outside input (scripts/fuzz.sh, PSM_FUZZ_SECONDS per target, 20 by default).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/env.sh
source scripts/env.sh
# A clean clone gains nothing from incremental artifacts; they only cost disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n==> %s\n' "$*"; }

"$root/scripts/setup.sh"

step "cargo fmt --check"
cargo fmt --all -- --check

step "the crate graph flows one way (scripts/check_crates.py)"
python3 scripts/check_crates.py

step "the documents name what exists (scripts/check_docs.py)"
python3 scripts/check_docs.py

step "files of one job: no file over 700 lines, no function over 120, no circle of modules (scripts/check_layout.py)"
python3 scripts/check_layout.py

step "cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets -- -D warnings

step "install the extension into PostgreSQL 16 ($PSM_PG16_BIN)"
scripts/install_extension.sh "$PSM_PG16_BIN/pg_config"

step "tests: unit, in-process engine, live clusters"
cargo test --workspace --no-fail-fast

step "the primary matrix: PostgreSQL 14, 17 and 18 primaries beside a PostgreSQL 16 sync replica (scripts/matrix.sh)"
scripts/matrix.sh

step "install the extension into PostgreSQL 15 ($PSM_PG15_BIN)"
scripts/install_extension.sh "$PSM_PG15_BIN/pg_config"

step "the extension's live tests on PostgreSQL 15 (sync replica and primaries)"
PSM_PG16_BIN="$PSM_PG15_BIN" cargo test -p powersync-mdbx-testkit --no-fail-fast

step "fuzzing: a short pass of each target (scripts/fuzz.sh ${PSM_FUZZ_SECONDS:-20})"
scripts/fuzz.sh "${PSM_FUZZ_SECONDS:-20}"

step "all checks passed"
