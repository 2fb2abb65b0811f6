#!/usr/bin/env bash
# Initial-replication benchmark: loads a fixture profile into a fresh primary, times the
# COPY floor (the primary's own scan read by a client), starts a sync replica on empty
# storage and measures the snapshot. Prints one JSON object.
#
#   scripts/bench.sh [profile]        profile: 100k (default), 250k, 1m, 2m, 5m
#   scripts/bench.sh fanout           the fan-out benchmark instead (scripts/bench_fanout.sh)
#   PSM_BENCH_BUILD=skip              use the installed extension as it is
#   PSM_BENCH_COMMITS=200             single-row commits timed from COMMIT to the client
#   PSM_BENCH_ROUNDS=10               full-table update rounds (0: no churn phase)
#   PSM_BENCH_GATES=1                 correctness gates (scripts/bench_gates.py); 0 skips
#   PSM_BENCH_PROFILE=<file>          perf record of the worker to readiness
#   PSM_BENCH_PROFILE_DOWNLOAD=<file> perf record of the worker during the download
#   PSM_BENCH_PROFILE_RECOPY=<file>   perf record of the worker during the re-copies
#   PSM_BENCH_DEPLOY=1                at the end, time two rules deploys (scripts/bench_deploy.py):
#                                     one adding a stream, one renaming tasks
#   PSM_BENCH_MIGRATION=1             then ALTER TABLE tasks ADD COLUMN (a column the rules do
#                                     not read) under a connected client, and time the next
#                                     PSM_BENCH_COMMITS commits (scripts/bench_stream.py)
#   PSM_BENCH_RECOPY=1                then migrations of columns the rules read (a retype that
#                                     keeps every output, a rename that changes them all): the
#                                     table's re-copy beside the stream, against the COPY floor
#   PSM_BENCH_REBUILD=1               then a rebuild from a new slot: the replica stopped, one
#                                     transaction changing the sentinel and 10,000 task rows, the
#                                     slot dropped on the primary, the replica started: how long
#                                     the rebuild held clients on the last checkpoint
#   PSM_BENCH_BULK=1                  at the end, bulk changes through the stream (scripts/bench_bulk.py):
#                                     pgbench single-row transactions at 2,000/s, then an UPDATE,
#                                     DELETE, INSERT of every task row and a TRUNCATE, each against
#                                     pg_recvlogical reading the same transaction (0 skips)
#   PSM_BENCH_LAG_SECONDS=60          how long pgbench runs (0: no small transactions)
#   PSM_BENCH_SEED=1                  after the snapshot, a second sync replica seeded from the first
#                                     (powersync_mdbx.seed_from): start until streaming, against
#                                     the snapshot's readiness (0 skips)
#   PSM_BENCH_PROFILE_SEED=<file>     perf record of the whole machine while the replica seeds
#   PSM_BENCH_JOIN=1                  after the gates, the join profile: a second sync replica on
#                                     empty storage with e2e/fixture/sync-config-join.yaml (project
#                                     access as a JOIN instead of a CTE), its readiness measured
#                                     like the first's (join_readiness_over_param); then with
#                                     both following the primary, a membership move against
#                                     PSM_BENCH_MEMBERSHIP_UPDATES single-row updates
#                                     (scripts/bench_membership.py), on the join replica, then on
#                                     the first (CTE rules); the join replica is then stopped.
#                                     With it, both readinesses start after a `sync`
#                                     (readiness_after_sync), so the first's is not comparable
#                                     with runs without the switch
#   PSM_BENCH_MEMBERSHIP_UPDATES=1000 single-row task updates the membership move is compared with
#   PSM_BENCH_JOIN_RULES=<file>       the second replica's rules instead (e2e/fixture/sync-config.yaml:
#                                     the same rules on both, a control for the order of the two)
#   PSM_BENCH_PROFILE_JOIN=<file>     perf record of the join replica's worker to its readiness
#   PSM_BENCH_PROFILE_BULK=<prefix>   perf record of the worker during each bulk change
#                                     (<prefix>.update, .delete, .insert, .truncate)
#   PSM_BENCH_PROFILE_BULK_DWARF=1    ... with DWARF call graphs (500 samples/s)
#   PSM_BENCH_LOG=<file>              where the replica's log is kept (/tmp/psm-bench-replica.log)
#
# Readiness is the fixture's probe (e2e/fixture/README.md): process start on empty storage
# until a /sync/stream response for the probe user reaches checkpoint_complete with
# checksums that add up and exactly the project's rows (checked against the primary).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
if [ "${1:-}" = fanout ]; then exec "$root/scripts/bench_fanout.sh" "${@:2}"; fi
profile="${1:-100k}"
case "$profile" in
  100k) vars=(-v U=256 -v P=250 -v T=400 -v D=100 -v S=0) ;;
  250k) vars=(-v U=512 -v P=500 -v T=500 -v D=200 -v S=200) ;;
  1m) vars=(-v U=1024 -v P=1000 -v T=1000 -v D=400 -v S=100) ;;
  2m) vars=(-v U=2048 -v P=2000 -v T=1000 -v D=800 -v S=100) ;;
  5m) vars=(-v U=4096 -v P=2500 -v T=2000 -v D=1000 -v S=50) ;;
  *) echo "unknown profile $profile (100k, 250k, 1m, 2m, 5m, fanout)" >&2; exit 2 ;;
esac
bin="$PSM_PG16_BIN"
log() { printf '%s\n' "$*" >&2; }

if [ "${PSM_BENCH_BUILD:-}" != skip ]; then
  log "building and installing the release extension"
  (cd "$root/extension" && cargo pgrx install --release --pg-config "$bin/pg_config" >/dev/null)
fi

now() { date +%s.%N; }

work="$(bench_workdir psm-bench)"
cleanup() { bench_cleanup "$work" "${PSM_BENCH_LOG:-/tmp/psm-bench-replica.log}"; }
trap cleanup EXIT

p_port="$(free_port)"; r_port="$(free_port)"; http_port="$(free_port)"
secret="bench-secret-$(date +%s%N)"
peer_secret="bench-peer-secret-$(date +%s%N)"
init_bench_clusters "$work" "$p_port"
cat >> "$work/primary/postgresql.conf" <<CONF
shared_buffers = 256MB
max_wal_size = 8GB
CONF
run_pg "$bin/pg_ctl" -w -D "$work/primary" -l "$work/primary.log" start >/dev/null
psql_p() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$work" -p "$p_port" -U postgres -d postgres "$@"; }

log "loading profile $profile"
psql_p -f "$root/e2e/fixture/schema.sql" >/dev/null
psql_p "${vars[@]}" -f "$root/e2e/fixture/data.sql" >/dev/null
psql_p -c "CHECKPOINT" >/dev/null
tasks="$(psql_p -c "SELECT count(*) FROM tasks")"
access="$(psql_p -c "SELECT count(*) FROM user_project_access")"
source_bytes="$(psql_p -c "SELECT pg_total_relation_size('tasks') + pg_total_relation_size('user_project_access')")"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
floor_run() {
  local t0 t1
  t0="$(now)"; psql_p -c "COPY tasks TO STDOUT $1" > /dev/null; t1="$(now)"
  python3 -c "print($t1 - $t0)"
}
log "timing the COPY floor (3 runs each)"
floor_text="$(for _ in 1 2 3; do floor_run ""; done | median)"
floor_binary="$(for _ in 1 2 3; do floor_run "(FORMAT binary)"; done | median)"

# A sync replica's configuration file $1: the sync rules $2, the sync port $3.
write_config() {
  cat > "$1" <<YAML
replication:
  connections:
    - type: postgresql
      uri: postgresql://postgres@127.0.0.1:$p_port/postgres?sslmode=disable
sync_config:
  path: $2
client_auth:
  audience: [powersync-user-value-benchmark]
  jwks:
    keys:
      - {kty: oct, alg: HS256, kid: bench, k: $(base64url "$secret")}
port: $3
YAML
}
write_config "$work/config.yaml" "$root/e2e/fixture/sync-config.yaml" "$http_port"
replica_settings "$work" "$r_port"
# The fleet's secret in a file only the server's user reads (powersync_mdbx.peer_secret_file).
printf '%s\n' "$peer_secret" > "$work/peer_secret"
chmod 600 "$work/peer_secret"
if [ "$(id -u)" -eq 0 ]; then chown "$PSM_TEST_USER" "$work/peer_secret"; fi
echo "powersync_mdbx.peer_secret_file = '$work/peer_secret'" >> "$work/replica/postgresql.conf"
echo "powersync_mdbx.peer_loopback = on" >> "$work/replica/postgresql.conf"
psql_at() { local port="$1"; shift; "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U postgres -d postgres "$@"; }
psql_r() { psql_at "$r_port" "$@"; }

# The sampling must not take CPU from the worker on a 2-core machine (forking psql,
# python3 and awk every 50 ms cost about half a core): /proc is read with shell builtins
# every 50 ms, and the status function is asked (psql only) every 0.5 s.
sample_memory() {
  local key value _
  while read -r key value _; do
    case "$key" in
      RssAnon:) [ "$value" -gt "$peak_anon" ] && peak_anon="$value" ;;
      RssFile:) [ "$value" -gt "$peak_file" ] && peak_file="$value" ;;
      VmHWM:) [ "$value" -gt "$peak_rss" ] && peak_rss="$value" ;;
    esac
  done < "/proc/$worker/status" || true
}

# Writes the worker's peak anonymous RSS (KiB) to $1 each time it grows, every 50 ms, until
# the worker is gone or the caller kills it (run in the background).
sample_peak_anon() {
  local before
  peak_anon=0
  while [ -r "/proc/$worker/status" ]; do
    before="$peak_anon"; sample_memory 2>/dev/null
    [ "$peak_anon" -gt "$before" ] && echo "$peak_anon" > "$1"
    sleep 0.05
  done
}

ticks="$(getconf CLK_TCK)"
# Readiness: starts the sync replica $work/$1 (port $2, sync port $3, log $work/$1.log) on
# empty storage, retrying the fixture's readiness probe from before `pg_ctl start` until a
# response reached checkpoint_complete ($work/$1.probe.json), then checks that the probe
# holds exactly project 1's rows, as the primary has them. $4: a perf record of the worker
# meanwhile (empty: none). Sets t_start, worker, peak_anon, peak_rss, peak_file (KiB) and cpu
# (the worker's CPU seconds to readiness).
start_until_ready() {
  local name="$1" port="$2" http="$3" perf_file="$4" probe_pid perf_pid="" tick=0 st pid phase=""
  # The join profile compares two readinesses: both start with the page cache written back
  # (otherwise the first replica's commits wait behind the kernel writing back the fixture's
  # load, about 1 GB at 1m, and the second's do not).
  if [ "${PSM_BENCH_JOIN:-0}" != 0 ]; then sync; fi
  t_start="$(now)"
  python3 "$root/scripts/bench_stream.py" probe "$http" "$secret" > "$work/$name.probe.json" &
  probe_pid=$!
  run_pg "$bin/pg_ctl" -w -D "$work/$name" -l "$work/$name.log" start >/dev/null
  psql_at "$port" -c "CREATE EXTENSION powersync_mdbx" >/dev/null
  worker=""
  peak_anon=0
  peak_rss=0
  peak_file=0
  while :; do
    if [ -z "$worker" ] || [ $((tick % 10)) -eq 0 ]; then
      st="$(psql_at "$port" -F ' ' -c "SELECT s->>'phase', s->>'worker_pid' FROM powersync_mdbx.status() AS s" 2>/dev/null || true)"
      phase="${st%% *}"
      pid="${st#* }"  # the whole of `st` when it has no second field
      [ -z "$worker" ] && [ "$pid" != "$st" ] && worker="$pid"
      if [ -n "$perf_file" ] && [ -n "$worker" ] && [ -z "$perf_pid" ]; then
        perf record -q -e cpu-clock -F 2000 -g -p "$worker" -o "$perf_file" >/dev/null 2>&1 &
        perf_pid=$!
      fi
    fi
    [ -n "$worker" ] && [ -r "/proc/$worker/status" ] && sample_memory
    case "$phase" in
      ready|streaming) kill -0 "$probe_pid" 2>/dev/null || break ;;
      failed|config_error) log "worker failed: $(psql_at "$port" -c "SELECT powersync_mdbx.status()" 2>&1)"; tail -20 "$work/$name.log" >&2; exit 1 ;;
    esac
    tick=$((tick + 1))
    sleep 0.05
  done
  wait "$probe_pid"
  if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true; fi
  cpu="$(awk -v t="$ticks" '{print ($14 + $15) / t}' "/proc/$worker/stat")"
  psql_p -c "SELECT json_agg(id ORDER BY id) FROM tasks WHERE project_id = 'project-org-001-0001'" > "$work/probe_expected.json"
  python3 - "$work/$name.probe.json" "$work/probe_expected.json" <<'PY'
import json, sys
got = json.load(open(sys.argv[1]))["row_ids"]
want = json.load(open(sys.argv[2]))
if sorted(got) != sorted(want):
    sys.exit(f"readiness probe rows differ from the primary: {len(got)} vs {len(want)}")
PY
}

wal_before="$(psql_p -c "SELECT pg_current_wal_insert_lsn()")"
log "starting the sync replica on empty storage"
start_until_ready replica "$r_port" "$http_port" "${PSM_BENCH_PROFILE:-}"
status="$(psql_r -c "SELECT powersync_mdbx.status()")"

# The store's file as the snapshot left it (churn below grows it: old and new records of a
# round coexist until it commits, and freed pages inside the file are reused, not returned).
store_dir="$work/replica.powersync_mdbx"
mdbx_bytes="$(stat -c %s "$store_dir/mdbx.dat")"
mdbx_alloc="$(( $(stat -c %b "$store_dir/mdbx.dat") * $(stat -c %B "$store_dir/mdbx.dat") ))"
wal_bytes="$(psql_p -c "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$wal_before')::bigint")"
worker_cpu() { awk -v t="$ticks" '{print ($14 + $15) / t}' "/proc/$worker/stat"; }
log "downloading the global tasks bucket on fresh connections (unparsed, then parsed)"
cpu_before="$(worker_cpu)"
if [ -n "${PSM_BENCH_PROFILE_DOWNLOAD:-}" ]; then
  perf record -q -e cpu-clock -F 2000 -g -p "$worker" -o "$PSM_BENCH_PROFILE_DOWNLOAD" >/dev/null 2>&1 &
  download_perf=$!
fi
download_raw="$(python3 "$root/scripts/bench_stream.py" download-raw "$http_port" "$secret")"
if [ -n "${download_perf:-}" ]; then kill -INT "$download_perf"; wait "$download_perf" 2>/dev/null || true; fi
download_cpu="$(awk -v a="$cpu_before" -v b="$(worker_cpu)" 'BEGIN {print b - a}')"
download="$(python3 "$root/scripts/bench_stream.py" download "$http_port" "$secret")"

gates='{}'
if [ "${PSM_BENCH_GATES:-1}" != 0 ]; then
  log "gates: the target user's buckets against the primary, authorization, the churn transaction"
  gates="$(python3 "$root/scripts/bench_gates.py" "$http_port" "$secret" \
    "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres)"
fi

# Another sync replica beside the first, in $work/$1 (port $2, sync port $3), on empty storage
# with the sync rules $4 and a slot of its own, $5; not started.
new_replica() {
  run_pg "$bin/initdb" --no-sync -E UTF8 --locale=C.UTF-8 --auth=trust -U postgres -D "$work/$1" >/dev/null
  write_config "$work/$1.yaml" "$4" "$3"
  replica_settings "$work" "$2" "$1" "$work/$1.yaml"
  echo "powersync_mdbx.slot_name = '$5'" >> "$work/$1/postgresql.conf"
}

join='{}'
if [ "${PSM_BENCH_JOIN:-0}" != 0 ]; then
  # In a subshell: the readiness globals (t_start, worker, the peaks, cpu) stay the first
  # replica's.
  join="$(
    log "the join profile: a second sync replica on empty storage with sync-config-join.yaml"
    j_port="$(free_port)"; j_http="$(free_port)"
    new_replica join "$j_port" "$j_http" "${PSM_BENCH_JOIN_RULES:-$root/e2e/fixture/sync-config-join.yaml}" psm_bench_join
    param_ready="$(python3 -c "import json; print(json.load(open('$work/replica.probe.json'))['ready_at'] - $t_start)")"
    param_cpu="$cpu"
    start_until_ready join "$j_port" "$j_http" "${PSM_BENCH_PROFILE_JOIN:-}"
    join_status="$(psql_at "$j_port" -c "SELECT powersync_mdbx.status()")"
    updates="${PSM_BENCH_MEMBERSHIP_UPDATES:-1000}"
    log "membership moves against $updates single-row updates: join rules, then the CTE rules"
    m_join="$(python3 "$root/scripts/bench_membership.py" "$j_http" "$secret" join "$updates" \
      "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres)"
    m_param="$(python3 "$root/scripts/bench_membership.py" "$http_port" "$secret" param "$updates" \
      "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres)"
    run_pg "$bin/pg_ctl" -w -D "$work/join" -m fast stop >/dev/null
    psql_p -c "SELECT pg_drop_replication_slot('psm_bench_join')" >/dev/null
    python3 - "$work/join.probe.json" "$t_start" "$param_ready" "$cpu" "$peak_anon" "$join_status" "$m_join" "$m_param" "$floor_text" "$param_cpu" <<'PY'
import json, sys
probe = json.load(open(sys.argv[1]))
ready = probe["ready_at"] - float(sys.argv[2])
param = float(sys.argv[3])
rep = json.loads(sys.argv[6]).get("replication") or {}
print(json.dumps({
    "join_readiness_seconds": round(ready, 3),
    "join_readiness_over_param": round(ready / param, 2),
    "join_readiness_over_floor": round(ready / float(sys.argv[9]), 2),
    "join_snapshot_seconds": round(rep.get("snapshot_seconds", 0), 3),
    "join_probe_rows": probe["rows"],
    "join_worker_cpu_seconds": round(float(sys.argv[4]), 3),
    "join_worker_cpu_over_param": round(float(sys.argv[4]) / float(sys.argv[10]), 2),
    "join_peak_anon_rss_bytes": int(sys.argv[5]) * 1024,
    **json.loads(sys.argv[7]),
    **json.loads(sys.argv[8]),
}))
PY
  )"
fi

seed='{}'
if [ "${PSM_BENCH_SEED:-1}" != 0 ]; then
  log "seeding a second sync replica from the first (powersync_mdbx.seed_from)"
  s_port="$(free_port)"; s_http="$(free_port)"
  new_replica seeded "$s_port" "$s_http" "$root/e2e/fixture/sync-config.yaml" psm_bench_seeded
  cat >> "$work/seeded/postgresql.conf" <<CONF
powersync_mdbx.peer_secret_file = '$work/peer_secret'
powersync_mdbx.seed_from = 'http://127.0.0.1:$http_port'
CONF
  psql_s() { psql_at "$s_port" "$@"; }
  seed_file_before="$(stat -c %s "$store_dir/mdbx.dat")"
  if [ -n "${PSM_BENCH_PROFILE_SEED:-}" ]; then
    # Both ends of the copy: the whole machine while the replica seeds.
    perf record -q -e cpu-clock -F 2000 -g -a -o "$PSM_BENCH_PROFILE_SEED" >/dev/null 2>&1 &
    seed_perf=$!
  fi
  t_seed="$(now)"
  run_pg "$bin/pg_ctl" -w -D "$work/seeded" -l "$work/seeded.log" start >/dev/null
  psql_s -c "CREATE EXTENSION powersync_mdbx" >/dev/null
  while :; do
    seeded_phase="$(psql_s -c "SELECT powersync_mdbx.status()->>'phase'" 2>/dev/null || true)"
    case "$seeded_phase" in
      ready|streaming) break ;;
      failed|config_error) log "seeding failed: $(psql_s -c "SELECT powersync_mdbx.status()" 2>&1)"; tail -20 "$work/seeded.log" >&2; exit 1 ;;
    esac
    sleep 0.05
  done
  seed_seconds="$(python3 -c "print($(now) - $t_seed)")"
  if [ -n "${seed_perf:-}" ]; then kill -INT "$seed_perf" 2>/dev/null; wait "$seed_perf" 2>/dev/null || true; fi
  # The seeded replica holds the first's buckets, under the same names.
  seeded_buckets="$(psql_s -c "SELECT md5(string_agg(bucket || ' ' || ops || ' ' || checksum || ' ' || last_op_id, ',' ORDER BY bucket)) FROM powersync_mdbx.buckets()")"
  first_buckets="$(psql_r -c "SELECT md5(string_agg(bucket || ' ' || ops || ' ' || checksum || ' ' || last_op_id, ',' ORDER BY bucket)) FROM powersync_mdbx.buckets()")"
  if [ "$seeded_buckets" != "$first_buckets" ]; then
    log "the seeded replica's buckets differ from the first's"; exit 1
  fi
  seeded_file="$(stat -c %s "$work/seeded.powersync_mdbx/mdbx.dat")"
  seed_file_after="$(stat -c %s "$store_dir/mdbx.dat")"
  run_pg "$bin/pg_ctl" -w -D "$work/seeded" -m fast stop >/dev/null
  grep -E "slot created, copying|seeded from the peer|worker started" "$work/seeded.log" >&2 || true
  psql_p -c "SELECT pg_drop_replication_slot('psm_bench_seeded')" >/dev/null
  seed="$(python3 -c 'import json,sys; s=float(sys.argv[1]); r=float(sys.argv[2]); print(json.dumps({"seed_seconds": round(s, 3), "seed_over_readiness": round(s / r, 2), "seeded_file_bytes": int(sys.argv[3]), "seed_peer_file_growth_bytes": int(sys.argv[5]) - int(sys.argv[4])}))' \
    "$seed_seconds" "$(python3 -c "import json; print(json.load(open('$work/replica.probe.json'))['ready_at'] - $t_start)")" "$seeded_file" "$seed_file_before" "$seed_file_after")"
fi

commits="${PSM_BENCH_COMMITS:-200}"
rounds="${PSM_BENCH_ROUNDS:-10}"
churn='{}'
churn_anon=0
if [ "$rounds" -gt 0 ] || [ "$commits" -gt 0 ]; then
  log "streaming: $commits timed commits, $rounds full-table update rounds"
  # Peak anonymous RSS while streaming (each round is one transaction of every task row).
  sample_peak_anon "$work/churn_anon" &
  sampler=$!
  churn="$(python3 "$root/scripts/bench_stream.py" churn "$http_port" "$secret" \
    "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres -- "$commits" "$rounds")"
  kill "$sampler" 2>/dev/null || true
  # Empty when the sampler was stopped while writing it.
  churn_anon="$(cat "$work/churn_anon" 2>/dev/null || true)"
  churn_anon="${churn_anon:-0}"
fi
status_after="$(psql_r -c "SELECT powersync_mdbx.status()")"
mdbx_bytes_after="$(stat -c %s "$store_dir/mdbx.dat")"

migration='{}'
if [ "${PSM_BENCH_MIGRATION:-0}" != 0 ]; then
  log "a migration: ALTER TABLE tasks ADD COLUMN under a connected client, then $commits commits"
  mdbx_before_migration="$(stat -c %s "$store_dir/mdbx.dat")"
  migration="$(python3 "$root/scripts/bench_stream.py" migration "$http_port" "$secret" \
    "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres -- "$commits")"
  phase_after="$(psql_r -c "SELECT powersync_mdbx.status()->>'phase'")"
  mdbx_after_migration="$(stat -c %s "$store_dir/mdbx.dat")"
  migration="$(python3 -c 'import json,sys; m=json.loads(sys.argv[1]); m["migration_phase_after"]=sys.argv[2]; m["migration_extra_file_bytes"]=int(sys.argv[4])-int(sys.argv[3]); print(json.dumps(m))' \
    "$migration" "$phase_after" "$mdbx_before_migration" "$mdbx_after_migration")"
fi

recopy='{}'
if [ "${PSM_BENCH_RECOPY:-0}" != 0 ]; then
  log "re-copies: columns the rules read retyped, then renamed, under a connected client"
  mdbx_before_recopy="$(stat -c %s "$store_dir/mdbx.dat")"
  sample_peak_anon "$work/recopy_anon" &
  sampler=$!
  if [ -n "${PSM_BENCH_PROFILE_RECOPY:-}" ]; then
    perf record -q -e cpu-clock -F 2000 -g -p "$worker" -o "$PSM_BENCH_PROFILE_RECOPY" >/dev/null 2>&1 &
    recopy_perf=$!
  fi
  recopy="$(python3 "$root/scripts/bench_stream.py" recopy "$http_port" "$secret" \
    "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres)"
  kill "$sampler" 2>/dev/null || true
  if [ -n "${recopy_perf:-}" ]; then kill -INT "$recopy_perf" 2>/dev/null; wait "$recopy_perf" 2>/dev/null || true; fi
  mdbx_after_recopy="$(stat -c %s "$store_dir/mdbx.dat")"
  recopy="$(python3 -c 'import json,sys; m=json.loads(sys.argv[1]); f=float(sys.argv[2]); m["recopy_retype_over_floor"]=round(m["recopy_retype_seconds"]/f,2); m["recopy_rename_over_floor"]=round(m["recopy_rename_seconds"]/f,2); m["recopy_retype_first_write_over_floor"]=round(m["recopy_retype_first_write_seconds"]/f,2); m["recopy_rename_first_write_over_floor"]=round(m["recopy_rename_first_write_seconds"]/f,2); m["recopy_extra_file_bytes"]=int(sys.argv[4])-int(sys.argv[3]); m["recopy_peak_anon_rss_bytes"]=int(sys.argv[5])*1024; print(json.dumps(m))' \
    "$recopy" "$floor_text" "$mdbx_before_recopy" "$mdbx_after_recopy" "$(cat "$work/recopy_anon" 2>/dev/null | grep . || echo 0)")"
fi

deploy='{}'
if [ "${PSM_BENCH_DEPLOY:-0}" != 0 ]; then
  for mode in add rename; do
    log "timing a rules deploy ($mode)"
    one="$(python3 "$root/scripts/bench_deploy.py" "$mode" "$work/config.yaml" \
      "$work/rules-deploy-$mode.yaml" "$store_dir" "$worker" -- "$bin/psql" -X -q -A -t \
      -v ON_ERROR_STOP=1 -h "$work" -p "$r_port" -U postgres -d postgres)"
    deploy="$(python3 -c 'import json,sys; print(json.dumps({**json.loads(sys.argv[1]), **json.loads(sys.argv[2])}))' "$deploy" "$one")"
  done
fi

rebuild='{}'
if [ "${PSM_BENCH_REBUILD:-0}" != 0 ]; then
  log "a rebuild from a new slot: the replica stopped, a transaction, the slot dropped, started again"
  run_pg "$bin/pg_ctl" -w -D "$work/replica" -m fast stop >/dev/null
  psql_p -c "BEGIN; UPDATE tasks SET story_points = -9999 WHERE id = 'task-sentinel-update-0001';
    UPDATE tasks SET priority = priority + 1 WHERE id IN (SELECT id FROM tasks ORDER BY id LIMIT 10000); COMMIT" >/dev/null
  psql_p -c "SELECT pg_drop_replication_slot('powersync_mdbx')" >/dev/null
  python3 "$root/scripts/bench_stream.py" sentinel "$http_port" "$secret" -9999 > "$work/rebuild_seen.json" &
  seen_pid=$!
  t_rebuild="$(now)"
  run_pg "$bin/pg_ctl" -w -D "$work/replica" -l "$work/replica.log" start >/dev/null
  wait "$seen_pid"
  worker="$(psql_r -c "SELECT powersync_mdbx.status()->>'worker_pid'")"
  # The worker's log reaches the server log through its main loop: wait for the line.
  rebuilt_line=""
  for _ in $(seq 1 300); do
    rebuilt_line="$(grep "rebuilt from a new slot" "$work/replica.log" | tail -1 || true)"
    [ -n "$rebuilt_line" ] && break
    sleep 0.1
  done
  [ -n "$rebuilt_line" ] || { log "no rebuild was logged"; tail -20 "$work/replica.log" >&2; exit 1; }
  log "$rebuilt_line"
  rebuild="$(python3 -c 'import json,re,sys; seen=json.load(open(sys.argv[1])); t=float(sys.argv[2]); f=float(sys.argv[3]); line=sys.argv[4]
held=float(re.search(r"seconds=\"?([0-9.]+)", line).group(1))
written=int(re.search(r"written=([0-9]+)", line).group(1))
print(json.dumps({"rebuild_seconds": held, "rebuild_over_floor": round(held / f, 2), "rebuild_rows_written": written,
  "rebuild_start_to_client_seconds": round(seen["seen_at"] - t, 3),
  "rebuild_client_connected_to_change_seconds": round(seen["seen_at"] - seen["connected_at"], 3)}))' \
    "$work/rebuild_seen.json" "$t_rebuild" "$floor_text" "$rebuilt_line")"
fi

bulk='{}'
if [ "${PSM_BENCH_BULK:-1}" != 0 ]; then
  log "bulk changes: single-row transactions at 2,000/s, then 1 M-row UPDATE, DELETE, INSERT, TRUNCATE"
  bulk="$(python3 "$root/scripts/bench_bulk.py" worker "$http_port" "$secret" "$worker" \
    "${PSM_BENCH_LAG_SECONDS:-60}" "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres)"
  log "the decoding floor: the sync replica stopped, pg_recvlogical reads the same transactions"
  run_pg "$bin/pg_ctl" -w -D "$work/replica" -m fast stop >/dev/null
  floor="$(python3 "$root/scripts/bench_bulk.py" floor "${PSM_BENCH_LAG_SECONDS:-60}" \
    "$bin/psql" -h "$work" -p "$p_port" -U postgres -d postgres)"
  bulk="$(python3 -c 'import json,sys; b={**json.loads(sys.argv[1]), **json.loads(sys.argv[2])}
for k in ("update", "delete", "insert", "truncate"):
    # A TRUNCATE decodes as one message: its floor is a few milliseconds, no ratio.
    f = b[f"bulk_{k}_floor_seconds"]
    b[f"bulk_{k}_over_floor"] = round(b[f"bulk_{k}_seconds"] / f, 2) if f >= 0.01 else None
print(json.dumps(b))' "$bulk" "$floor")"
fi

python3 - "$status" "$work/replica.probe.json" "$churn" "$status_after" "$download" "$download_raw" "$gates" "$deploy" "$migration" "$recopy" "$bulk" "$seed" "$rebuild" "$join" <<PY
import json, sys
status = json.loads(sys.argv[1])
probe = json.load(open(sys.argv[2]))
churn = json.loads(sys.argv[3])
after = json.loads(sys.argv[4])
download = json.loads(sys.argv[5])
download_raw = json.loads(sys.argv[6])
gates = json.loads(sys.argv[7])
deploy = json.loads(sys.argv[8])
migration = json.loads(sys.argv[9])
recopy = json.loads(sys.argv[10])
bulk = json.loads(sys.argv[11])
seed = json.loads(sys.argv[12])
rebuild = json.loads(sys.argv[13])
join = json.loads(sys.argv[14])
rep = status.get("replication") or {}
rows = $tasks + $access
ready = probe["ready_at"] - $t_start
out = {
  "profile": "$profile",
  "rows": rows,
  "task_rows": $tasks,
  "floor_text_seconds": round($floor_text, 3),
  "floor_binary_seconds": round($floor_binary, 3),
  "snapshot_seconds": round(rep.get("snapshot_seconds", 0), 3),
  "readiness_seconds": round(ready, 3),
  "readiness_over_floor": round(ready / $floor_text, 2),
  "readiness_after_sync": "${PSM_BENCH_JOIN:-0}" != "0",
  "probe_rows": probe["rows"],
  "worker_cpu_seconds": round($cpu, 3),
  "worker_cpu_us_per_row": round($cpu * 1e6 / rows, 2),
  "peak_anon_rss_bytes": $peak_anon * 1024,
  "peak_rss_bytes": $peak_rss * 1024,
  "peak_file_rss_bytes": $peak_file * 1024,
  "wal_bytes": $wal_bytes,
  "mdbx_file_bytes": $mdbx_bytes,
  "mdbx_used_bytes": status["store"]["used_bytes"],
  "mdbx_allocated_bytes": $mdbx_alloc,
  "source_relation_bytes": $source_bytes,
  "mdbx_used_over_source": round(status["store"]["used_bytes"] / $source_bytes, 3),
  **download,
  **download_raw,
  **gates,
  **join,
  "download_worker_cpu_seconds": round($download_cpu, 3),
  **seed,
  **churn,
  **({"churn_rows_per_second": round(churn["rounds"] * $tasks / churn["rounds_seconds"])}
     if churn.get("rounds") else {}),
  "mdbx_file_bytes_after_churn": $mdbx_bytes_after,
  "mdbx_used_bytes_after_churn": after["store"]["used_bytes"],
  "peak_anon_rss_bytes_streaming": $churn_anon * 1024,
  **deploy,
  **migration,
  **recopy,
  **rebuild,
  **bulk,
  **({f"bulk_{k}_cpu_over_snapshot": round(bulk[f"bulk_{k}_worker_cpu_us_per_row"] / ($cpu * 1e6 / rows), 2)
      for k in ("update", "delete", "insert", "truncate")} if bulk else {}),
}
print(json.dumps(out))
PY
