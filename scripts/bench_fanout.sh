#!/usr/bin/env bash
# Fan-out benchmark (issue 26): many idle /sync/stream connections on one sync replica,
# one commit every stream's buckets hold, per-user buckets under a steady commit rate, and
# connections past the stream cap. The load generator is `psm-fanout`
# (e2e/testkit/src/bin/psm_fanout/); this script gives it a throwaway primary and sync replica,
# runs each scenario, prints a table (target, measured, pass/fail) on stderr and one JSON
# object on stdout. `scripts/bench.sh fanout` runs it too.
#
#   PSM_BENCH_BUILD=skip         use the installed extension as it is (otherwise the release
#                                build is installed first)
#   PSM_FANOUT_BIN=<file>        a built psm-fanout (otherwise `cargo build --release` of it,
#                                a no-op when it is up to date)
#   PSM_FANOUT_STREAMS=10000     streams of the idle, fan-out and per-user runs
#   PSM_FANOUT_CODINGS="identity zstd gzip"   response codings of the idle runs
#   PSM_FANOUT_RATE=1000         per-user run: single-row commits per second ...
#   PSM_FANOUT_SECONDS=20        ... for this long
#   PSM_FANOUT_CAP=18000         the worker's stream cap (api.parameters.max_concurrent_connections)
#   PSM_FANOUT_OVER=500          connections opened past the cap (0: no cap run)
#   PSM_FANOUT_LOG=<file>        where the replica's log is kept (/tmp/psm-fanout-replica.log)
#   PSM_FANOUT_PROFILE=<prefix>  `perf record -g` of the worker around each idle run's commit,
#                                written to <prefix>.<run> (the commit's timing then includes
#                                perf's own cost: for profiles, not for the table)
#
# Every stream is its own user u<i> with a token of its own; the rules give each stream
# the global bucket (100 rows) and its user's bucket (one row for users below
# PSM_FANOUT_STREAMS). The worker is restarted before each run, so each memory figure
# starts from a worker that held no streams.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
bin="$PSM_PG16_BIN"
streams="${PSM_FANOUT_STREAMS:-10000}"
codings="${PSM_FANOUT_CODINGS:-identity zstd gzip}"
rate="${PSM_FANOUT_RATE:-1000}"
seconds="${PSM_FANOUT_SECONDS:-20}"
cap="${PSM_FANOUT_CAP:-18000}"
over="${PSM_FANOUT_OVER:-500}"
log() { printf '%s\n' "$*" >&2; }

if [ "${PSM_BENCH_BUILD:-}" != skip ]; then
  log "building and installing the release extension"
  "$root/scripts/install_extension.sh" "$bin/pg_config" --release
fi
fanout="${PSM_FANOUT_BIN:-}"
if [ -z "$fanout" ]; then
  log "building psm-fanout (release)"
  (cd "$root" && cargo build --release -q -p powersync-mdbx-testkit --no-default-features \
    --features fanout --bin psm-fanout)
  fanout="${CARGO_TARGET_DIR:-$root/target}/release/psm-fanout"
fi

work="$(bench_workdir psm-fanout)"
cleanup() { bench_cleanup "$work" "${PSM_FANOUT_LOG:-/tmp/psm-fanout-replica.log}"; }
trap cleanup EXIT

p_port="$(free_port)"; r_port="$(free_port)"; http_port="$(free_port)"
secret="fanout-secret-$(date +%s%N)"
audience="powersync-mdbx-fanout"
init_bench_clusters "$work" "$p_port"
run_pg "$bin/pg_ctl" -w -D "$work/primary" -l "$work/primary.log" start >/dev/null
psql_p() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$work" -p "$p_port" -U postgres -d postgres "$@"; }
psql_p <<SQL
CREATE TABLE notes (id text PRIMARY KEY, owner text, body text);
CREATE INDEX ON notes (owner);
CREATE PUBLICATION powersync FOR TABLE notes;
INSERT INTO notes SELECT 'g' || g, NULL, 'global note ' || g FROM generate_series(1, 100) g;
INSERT INTO notes SELECT 'u' || g, 'u' || g, 'note of u' || g FROM generate_series(0, $streams - 1) g;
SQL

cat > "$work/config.yaml" <<YAML
replication:
  connections:
    - type: postgresql
      uri: postgresql://postgres@127.0.0.1:$p_port/postgres?sslmode=disable
sync_config:
  content: |
    bucket_definitions:
      global:
        data:
          - SELECT id, body FROM notes WHERE owner IS NULL
      by_user:
        parameters: SELECT request.user_id() AS user_id
        data:
          - SELECT id, body FROM notes WHERE owner = bucket.user_id
client_auth:
  audience: [$audience]
  jwks:
    keys:
      - {kty: oct, alg: HS256, kid: k1, k: $(base64url "$secret")}
api:
  parameters:
    max_concurrent_connections: $cap
port: $http_port
YAML
replica_settings "$work" "$r_port"
psql_r() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$work" -p "$r_port" -U postgres -d postgres "$@"; }

# Waits until the worker streams; prints its pid.
wait_streaming() {
  local phase pid st
  for _ in $(seq 1 1200); do
    st="$(psql_r -F ' ' -c "SELECT s->>'phase', s->>'worker_pid' FROM powersync_mdbx.status() AS s" 2>/dev/null || true)"
    phase="${st%% *}"; pid="${st#* }"
    case "$phase" in
      streaming) echo "$pid"; return 0 ;;
      failed|config_error) log "worker $phase: $(psql_r -c "SELECT powersync_mdbx.status()" 2>&1)"; tail -20 "$work/replica.log" >&2; return 1 ;;
    esac
    sleep 0.1
  done
  log "the worker did not reach streaming in 120 s"; tail -20 "$work/replica.log" >&2; return 1
}

log "starting the sync replica ($streams users' rows, stream cap $cap)"
run_pg "$bin/pg_ctl" -w -D "$work/replica" -l "$work/replica.log" start >/dev/null
psql_r -c "CREATE EXTENSION powersync_mdbx" >/dev/null
pid="$(wait_streaming)"
log "the worker's descriptor limit: $(grep 'Max open files' "/proc/$pid/limits")"

# A fresh worker process (a restart of the replica) for each run; prints its pid once it
# streams and its memory has settled.
fresh_worker() {
  run_pg "$bin/pg_ctl" -w -D "$work/replica" -l "$work/replica.log" -m fast restart >/dev/null
  local pid; pid="$(wait_streaming)"
  sleep 2
  echo "$pid"
}

commit_cmd="$bin/psql -X -q -h $work -p $p_port -U postgres -d postgres -c \"UPDATE notes SET body = 'changed ' || clock_timestamp() WHERE id = 'g1'\""
common=(--port "$http_port" --secret "$secret" --audience "$audience")
names=()
for coding in $codings; do
  name="idle_$coding"
  log "run $name: $streams streams ($coding), 5 s of quiet, one commit to the global bucket"
  pid="$(fresh_worker)"
  cmd="$commit_cmd"
  if [ -n "${PSM_FANOUT_PROFILE:-}" ]; then
    cmd="perf record -q -F 2999 -g -p $pid -o ${PSM_FANOUT_PROFILE}.$name -- sleep 2 >/dev/null 2>&1 & sleep 0.5; $commit_cmd"
  fi
  "$fanout" open "${common[@]}" --streams "$streams" --coding "$coding" --worker-pid "$pid" \
    --commit-cmd "$cmd" > "$work/$name.json"
  names+=("$name")
done

log "run per_user: $streams streams, $rate single-row commits/s for $seconds s"
pid="$(fresh_worker)"
"$fanout" per-user "${common[@]}" --streams "$streams" --rate "$rate" --seconds "$seconds" \
  --worker-pid "$pid" --primary "host=127.0.0.1 port=$p_port user=postgres dbname=postgres" > "$work/per_user.json"
names+=(per_user)

if [ "$over" -gt 0 ]; then
  total=$((cap + over))
  log "run cap: $total streams against a cap of $cap"
  pid="$(fresh_worker)"
  "$fanout" open "${common[@]}" --streams "$total" --worker-pid "$pid" > "$work/cap.json"
  names+=(cap)
fi

# Stopped here, so that what its shutdown logs is read too.
run_pg "$bin/pg_ctl" -w -D "$work/replica" -m fast stop >/dev/null
grep -E "ERROR|WARNING|FATAL|PANIC|panicked" "$work/replica.log" > "$work/log_problems.txt" || true
python3 - "$work" "$streams" "$rate" "$seconds" "$cap" "$over" \
  "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" "${names[@]}" <<'PY'
import json, os, sys
work, streams, rate, seconds, cap, over, commit = sys.argv[1:8]
streams, cap, over, rate, seconds = int(streams), int(cap), int(over), float(rate), float(seconds)
runs = {name: json.load(open(os.path.join(work, name + ".json"))) for name in sys.argv[8:]}
rows = []
def row(target, measured, ok):
    rows.append({"target": target, "measured": measured, "pass": bool(ok)})

def cpu(phase):
    """The CPU seconds the worker and psm-fanout took in a phase, as text."""
    return (f"worker CPU {phase.get('worker_cpu_seconds')} s, psm-fanout "
            f"{phase.get('psm_fanout_cpu_seconds')} s in {phase.get('wall_seconds')} s")

def memory_row(label, r):
    """The memory-per-stream target of an opening run `r`."""
    per = r.get("kib_per_stream")
    row(f"{label}: worker RssAnon per stream <= 16 KiB",
        f"{per} KiB ({r.get('rss_anon_kib_before')} -> {r.get('rss_anon_kib_after')} KiB, "
        f"{r['streams_opened']:,} streams)", per is not None and per <= 16)

for name, r in runs.items():
    if not name.startswith("idle_"):
        continue
    coding = r["coding"]
    memory_row(f"{streams:,} idle streams ({coding})", r)
    row(f"{streams:,} streams ({coding}) opened, first checkpoint_complete each, <= 3 s",
        f"{r['open_seconds']} s, {r['streams_opened']:,} of {r['streams_requested']:,} "
        f"({cpu(r['opening'])})",
        r["streams_opened"] == streams and r["open_seconds"] <= 3)
    c = r.get("commit") or {}
    lat = c.get("seconds_from_command_start") or {}
    row(f"one commit to the global bucket ({coding}): every stream's checkpoint_complete, p99 <= 0.25 s",
        f"p50 {lat.get('p50')} s, p99 {lat.get('p99')} s, max {lat.get('max')} s; "
        f"{c.get('streams_reached', 0):,} of {c.get('streams_open', 0):,} streams "
        f"(psql {c.get('command_seconds')} s; {cpu(c)})",
        c.get("streams_reached") == streams and lat.get("p99") is not None and lat["p99"] <= 0.25)

if "per_user" in runs:
    r = runs["per_user"]
    lat = r["commit_to_checkpoint_complete_ms"]
    row(f"{streams:,} per-user streams, {rate:,.0f} commits/s for {seconds:g} s: "
        "COMMIT -> that user's checkpoint_complete p99 <= 20 ms",
        f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms; "
        f"{r['commits_measured']:,} of {r['commits_issued']:,} commits measured "
        f"({cpu(r['commits_phase'])})",
        r["streams_opened"] == streams and r["commits_measured"] == r["commits_issued"] > 0
        and r["markers_on_another_users_stream"] == 0 and lat["p99"] is not None and lat["p99"] <= 20)
    row(f"per-user run: commits issued at {rate:,.0f}/s (>= 95 %)",
        f"{r['commit_rate_achieved']}/s, {r['commits_issued']:,} of {r['commits_planned']:,}; "
        f"COMMIT round trip p99 {r['commit_round_trip_ms']['p99']} ms",
        r["commit_rate_achieved"] is not None and r["commit_rate_achieved"] >= 0.95 * rate)

if "cap" in runs:
    r = runs["cap"]
    memory_row(f"{cap:,} streams (the cap)", r)
    row(f"{cap:,} streams opened under a cap of {cap:,}",
        f"{r['streams_opened']:,} in {r['open_seconds']} s", r["streams_opened"] == cap)
    refused = r.get("refused", {})
    clean = refused.get("429", 0) + refused.get("503", 0)
    row(f"{over:,} connections past the cap refused cleanly (429/503)",
        f"{clean:,} refused ({', '.join(f'{k}: {v}' for k, v in refused.items()) or 'none'}), "
        f"{r['failed']} failed", clean == over and r["failed"] == 0)

problems = [l.rstrip("\n") for l in open(os.path.join(work, "log_problems.txt"))]
width = max(len(x["target"]) for x in rows)
print(f"\nfan-out benchmark, commit {commit}", file=sys.stderr)
for x in rows:
    print(f"{'PASS' if x['pass'] else 'FAIL'}  {x['target']:<{width}}  {x['measured']}", file=sys.stderr)
print(f"replica log: {len(problems)} ERROR/WARNING/FATAL/PANIC lines", file=sys.stderr)
for line in problems[:10]:
    print(f"  {line}", file=sys.stderr)
print(json.dumps({"commit": commit, "streams": streams, "targets": rows, "runs": runs,
                  "replica_log_problems": problems[:50]}))
PY
