#!/usr/bin/env bash
# The benchmark ladder: every profile, several repeats, each run a fresh primary and sync
# replica (scripts/bench.sh, with its correctness gates). Repeats are interleaved (all
# profiles once, then again) so drift on a shared machine spreads over every profile.
# Writes one JSON per run, summary.json and results.md (medians, min–max) to the results
# directory and prints the table.
#
#   scripts/bench_ladder.sh [results-dir]
#   PSM_LADDER_PROFILES="100k 250k 1m 2m"   profiles, in order
#   PSM_LADDER_REPEATS=3                    runs per profile
#   PSM_BENCH_COMMITS / PSM_BENCH_ROUNDS     passed on (default here: 50 commits, 0 rounds)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
out="${1:-$root/target/bench/$(date -u +%Y%m%dT%H%M%SZ)}"
profiles="${PSM_LADDER_PROFILES:-100k 250k 1m 2m}"
repeats="${PSM_LADDER_REPEATS:-3}"
mkdir -p "$out"
log() { printf '%s\n' "$*" >&2; }

if [ "${PSM_BENCH_BUILD:-}" != skip ]; then
  log "building and installing the release extension"
  (cd "$root/extension" && cargo pgrx install --release --pg-config "$PSM_PG16_BIN/pg_config" >/dev/null)
fi
{
  echo "commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo '+dirty')"
  echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB"
  echo "command: PSM_LADDER_PROFILES=\"$profiles\" PSM_LADDER_REPEATS=$repeats scripts/bench_ladder.sh"
} > "$out/machine.txt"

for r in $(seq 1 "$repeats"); do
  for profile in $profiles; do
    log "== $profile, run $r of $repeats"
    PSM_BENCH_BUILD=skip \
    PSM_BENCH_COMMITS="${PSM_BENCH_COMMITS:-50}" \
    PSM_BENCH_ROUNDS="${PSM_BENCH_ROUNDS:-0}" \
      "$root/scripts/bench.sh" "$profile" > "$out/$profile-$r.json"
  done
done
{
  cat "$out/machine.txt"
  echo
  python3 "$root/scripts/bench_report.py" "$out"
} > "$out/results.md"
cat "$out/results.md"
log "results in $out"
