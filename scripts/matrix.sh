#!/usr/bin/env bash
# The primary matrix: the replication crate's live tests and the official SDK's live tests
# against PostgreSQL 14, 17 and 18 primaries (about 5 minutes per major here), the SDK's
# with a PostgreSQL 16 sync replica with the extension installed. Called by scripts/test.sh after scripts/install_primaries.sh (setup) and
# scripts/install_extension.sh for PostgreSQL 16. PostgreSQL 13 is refused
# (worker/source/tests/validate.rs checks that in every run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/env.sh
source scripts/env.sh
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

for major in 14 17 18; do
  printf '\n==> replication against a PostgreSQL %s primary\n' "$major"
  PSM_PRIMARY_BIN="$PSM_TOOLS/pg$major/bin" \
    cargo test -p powersync-mdbx-replication --test replication --no-fail-fast
  printf '\n==> the official SDK against a PostgreSQL %s primary\n' "$major"
  PSM_PRIMARY_BIN="$PSM_TOOLS/pg$major/bin" \
    cargo test -p powersync-mdbx-testkit --test live --no-fail-fast -- e2e_sdk::
done
