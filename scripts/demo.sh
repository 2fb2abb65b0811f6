#!/usr/bin/env bash
# Runs powersync_mdbx on this machine: a PostgreSQL 16 primary loaded with a small profile
# of the fixture, a sync replica whose background worker serves the PowerSync protocol, and
# everything a client needs to connect (endpoint, a development token, the SDK command).
#
#   scripts/demo.sh [start]        set up, start, wait for phase `streaming`, print how to connect
#   scripts/demo.sh stop           stop the demo's clusters (idempotent)
#   scripts/demo.sh status         powersync_mdbx.status() and the endpoint
#   scripts/demo.sh token [user]   a fresh development token (default user-org-001-0001, 1 h)
#
#   PSM_DEMO_DIR=/tmp/powersync-mdbx-demo   where the clusters, config, secret and logs live
#   PSM_DEMO_SKIP_SETUP=1                   do not run scripts/setup.sh first
#   PSM_DEMO_BUILD=skip                     use the installed extension as it is
#   PSM_DEMO_PROFILE="U=8 P=12 T=25 D=6 S=4"  fixture size (e2e/fixture/README.md)
#
# Everything listens on 127.0.0.1 only, on free ports; <demo dir>/demo.env records them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
source "$root/scripts/env.sh"
bin="$PSM_PG16_BIN"
dir="${PSM_DEMO_DIR:-/tmp/powersync-mdbx-demo}"
envfile="$dir/demo.env"
marker="$dir/.powersync-mdbx-demo"
target_user="user-org-001-0001"
audience_demo="powersync-mdbx-demo"
# e2e/client.mjs signs its own tokens with this audience (e2e/lib/token.mjs).
audience_e2e="powersync-mdbx-test"

log() { printf '%s\n' "$*" >&2; }
die() { log "demo: $*"; exit 1; }

# The postmaster pid of a data directory, when that postmaster is alive.
live_pid() {
  local pidfile="$1/postmaster.pid" pid
  [ -f "$pidfile" ] || return 1
  pid="$(head -1 "$pidfile" 2>/dev/null)" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # Guard against a reused pid: it must be a postgres whose data directory is this one.
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "postgres" || return 1
  [ "$(readlink -f "/proc/$pid/cwd" 2>/dev/null)" = "$(readlink -f "$1")" ] || return 1
  printf '%s\n' "$pid"
}

# Fast shutdown of one cluster by its postmaster pid; waits until it is gone.
stop_cluster() {
  local name="$1" pid i
  pid="$(live_pid "$dir/$name")" || return 0
  log "stopping the $name (postmaster pid $pid)"
  kill -INT "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
    [ "$i" -eq 60 ] && kill -QUIT "$pid" 2>/dev/null || true
  done
  kill -0 "$pid" 2>/dev/null && log "the $name (pid $pid) did not stop; see $dir/$name.log"
  return 0
}

load_env() {
  [ -f "$envfile" ] || die "no demo in $dir (start one with scripts/demo.sh)"
  # shellcheck disable=SC1090
  source "$envfile"
}

psql_p() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$dir" -p "$PSM_DEMO_PRIMARY_PORT" -U postgres -d postgres "$@"; }
psql_r() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$dir" -p "$PSM_DEMO_REPLICA_PORT" -U postgres -d postgres "$@"; }

# An HS256 development token for user $1, valid $2 seconds, signed with the demo's secret
# (base64url in <demo dir>/jwt-secret) with the standard library only.
mint_token() {
  python3 - "$dir/jwt-secret" "$1" "${2:-3600}" "$audience_demo" <<'PY'
import base64, hashlib, hmac, json, sys, time
secret_file, sub, ttl, aud = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
raw = open(secret_file).read().strip()
key = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
now = int(time.time())
head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "psm-demo"}, separators=(",", ":")).encode())
body = b64(json.dumps({"sub": sub, "aud": aud, "iat": now, "exp": now + ttl}, separators=(",", ":")).encode())
sig = b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
print(f"{head}.{body}.{sig}")
PY
}

status_json() { psql_r -c "SELECT jsonb_pretty(powersync_mdbx.status())"; }

cmd_stop() {
  if [ ! -d "$dir" ]; then log "no demo in $dir"; return 0; fi
  local any=0
  for name in replica primary; do
    if live_pid "$dir/$name" >/dev/null; then any=1; stop_cluster "$name"; fi
  done
  [ "$any" -eq 1 ] && log "demo stopped (files kept in $dir)" || log "no demo running in $dir"
}

cmd_status() {
  load_env
  local state
  for name in primary replica; do
    if state="$(live_pid "$dir/$name")"; then log "$name: running (pid $state)"; else log "$name: not running"; fi
  done
  live_pid "$dir/replica" >/dev/null || exit 1
  status_json
  printf 'endpoint: %s\n' "$PSM_DEMO_ENDPOINT"
}

cmd_token() {
  load_env
  mint_token "${1:-$target_user}" 3600
}

cmd_start() {
  if [ -f "$envfile" ] || [ -f "$marker" ]; then
    for name in primary replica; do
      if pid="$(live_pid "$dir/$name")"; then
        die "a demo is already running in $dir ($name postmaster pid $pid); run 'scripts/demo.sh stop' first, or set PSM_DEMO_DIR"
      fi
    done
  elif [ -d "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    die "$dir exists and is not a demo directory; choose another PSM_DEMO_DIR"
  fi

  if [ "${PSM_DEMO_SKIP_SETUP:-}" != 1 ]; then
    log "==> scripts/setup.sh (idempotent; the first run installs cargo-pgrx, about 12 minutes)"
    "$root/scripts/setup.sh"
  fi
  if [ "${PSM_DEMO_BUILD:-}" != skip ]; then
    log "==> building and installing the release extension into PostgreSQL 16"
    (cd "$root/extension" && cargo pgrx install --release --pg-config "$bin/pg_config" >/dev/null)
  fi
  [ -x "$bin/initdb" ] || die "no PostgreSQL 16 at $bin (run scripts/setup.sh)"
  [ -f "$("$bin/pg_config" --pkglibdir)/powersync_mdbx.so" ] \
    || die "powersync_mdbx is not installed into $bin (run without PSM_DEMO_BUILD=skip)"
  if [ "$(id -u)" -eq 0 ]; then
    id "$PSM_TEST_USER" >/dev/null 2>&1 || die "system user $PSM_TEST_USER is missing (run scripts/setup.sh)"
  fi

  # From here on, an interrupt or a failure stops whatever was started.
  started=0
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'if [ "$started" != 1 ]; then log "demo: start aborted, stopping what was started"; cmd_stop 2>&1 | sed "s/^/  /" >&2; fi' EXIT

  # A previous (stopped) demo: remove only what this script creates.
  rm -rf "$dir/primary" "$dir/replica" "$dir/replica.powersync_mdbx" "$dir/client" \
    "$dir"/*.log "$dir/config.yaml" "$dir/jwt-secret" "$envfile"
  mkdir -p "$dir"
  touch "$marker"
  if [ "$(id -u)" -eq 0 ]; then chown "$PSM_TEST_USER" "$dir"; fi
  chmod 755 "$dir"

  local p_port r_port http_port
  p_port="$(free_port)"; r_port="$(free_port)"; http_port="$(free_port)"
  while [ "$r_port" = "$p_port" ]; do r_port="$(free_port)"; done
  while [ "$http_port" = "$p_port" ] || [ "$http_port" = "$r_port" ]; do http_port="$(free_port)"; done
  PSM_DEMO_PRIMARY_PORT="$p_port"; PSM_DEMO_REPLICA_PORT="$r_port"

  # A random 256-bit HS256 key, base64url; the JWK's `k` is the same text.
  python3 -c 'import base64,secrets; print(base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode())' \
    >"$dir/jwt-secret"
  chmod 600 "$dir/jwt-secret"
  local secret; secret="$(cat "$dir/jwt-secret")"

  log "==> primary (PostgreSQL 16, port $p_port) and sync replica (port $r_port) in $dir"
  for name in primary replica; do
    run_pg "$bin/initdb" --no-sync -E UTF8 --locale=C.UTF-8 --auth=trust -U postgres -D "$dir/$name" >/dev/null
  done
  cat >>"$dir/primary/postgresql.conf" <<CONF
port = $p_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
fsync = off
CONF
  # setsid: the clusters outlive this script and the terminal it ran in.
  run_pg setsid "$bin/pg_ctl" -w -D "$dir/primary" -l "$dir/primary.log" start >/dev/null

  local profile="${PSM_DEMO_PROFILE:-U=8 P=12 T=25 D=6 S=4}" vars=() kv
  for kv in $profile; do vars+=(-v "$kv"); done
  log "==> loading the fixture ($profile)"
  PGOPTIONS="-c client_min_messages=warning" psql_p -f "$root/e2e/fixture/schema.sql" >/dev/null
  psql_p "${vars[@]}" -f "$root/e2e/fixture/data.sql" >/dev/null
  local tasks access
  tasks="$(psql_p -c "SELECT count(*) FROM tasks")"
  access="$(psql_p -c "SELECT count(*) FROM user_project_access WHERE user_id = '$target_user'")"

  cat >"$dir/config.yaml" <<YAML
# powersync_mdbx demo configuration (scripts/demo.sh), the PowerSync service's format.
replication:
  connections:
    - type: postgresql
      uri: postgresql://postgres@127.0.0.1:$p_port/postgres
      sslmode: disable
sync_config:
  path: $root/e2e/fixture/sync-config.yaml
client_auth:
  # $audience_demo: tokens from 'scripts/demo.sh token'; $audience_e2e: e2e/client.mjs.
  audience: [$audience_demo, $audience_e2e]
  jwks:
    keys:
      - {kty: oct, alg: HS256, kid: psm-demo, k: $secret}
      - {kty: oct, alg: HS256, kid: psm-e2e, k: $secret}
port: $http_port
YAML
  # The worker runs as the cluster's owner and reads the file; the secret is in it.
  if [ "$(id -u)" -eq 0 ]; then chown "$PSM_TEST_USER" "$dir/config.yaml"; fi
  chmod 600 "$dir/config.yaml"
  cat >>"$dir/replica/postgresql.conf" <<CONF
port = $r_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'powersync_mdbx'
powersync_mdbx.config_file = '$dir/config.yaml'
CONF
  run_pg setsid "$bin/pg_ctl" -w -D "$dir/replica" -l "$dir/replica.log" start >/dev/null
  psql_r -c "CREATE EXTENSION IF NOT EXISTS powersync_mdbx" >/dev/null

  log "==> waiting for the worker to reach phase 'streaming'"
  local st phase="" deadline=$((SECONDS + ${PSM_DEMO_TIMEOUT_S:-120}))
  while :; do
    st="$(psql_r -c "SELECT powersync_mdbx.status()" 2>/dev/null || true)"
    phase="$(printf '%s' "$st" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("phase",""))' 2>/dev/null || true)"
    case "$phase" in
      streaming) break ;;
      failed|config_error)
        log "the worker reports phase $phase: $st"; tail -20 "$dir/replica.log" >&2; exit 1 ;;
    esac
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "still not streaming (phase '${phase:-?}'): $st"; tail -20 "$dir/replica.log" >&2; exit 1
    fi
    sleep 0.2
  done

  local endpoint="http://127.0.0.1:$http_port" token
  token="$(mint_token "$target_user" 3600)"
  cat >"$envfile" <<ENV
# scripts/demo.sh: the running demo (source it).
PSM_DEMO_DIR='$dir'
PSM_DEMO_PRIMARY_PID=$(live_pid "$dir/primary")
PSM_DEMO_REPLICA_PID=$(live_pid "$dir/replica")
PSM_DEMO_PRIMARY_PORT=$p_port
PSM_DEMO_REPLICA_PORT=$r_port
PSM_DEMO_HTTP_PORT=$http_port
PSM_DEMO_ENDPOINT='$endpoint'
PSM_DEMO_JWT_SECRET='$secret'
PSM_DEMO_AUDIENCE='$audience_demo'
PSM_DEMO_PRIMARY_URI='postgresql://postgres@127.0.0.1:$p_port/postgres'
ENV
  chmod 600 "$envfile"
  started=1
  trap - INT TERM EXIT

  local sub_body='{"buckets":[],"include_checksum":true,"raw_data":true,"streams":{"include_defaults":false,"subscriptions":[{"stream":"tasks_by_auth_project","parameters":{},"override_priority":null}]}}'
  local rel_dir; rel_dir="$(realpath --relative-to="$PWD" "$root" 2>/dev/null || echo "$root")"
  cat <<OUT

powersync_mdbx demo is running (phase streaming): $tasks task rows on the primary,
$access projects shared with $target_user.

Endpoint (PowerSync SDK 'endpoint'):
  $endpoint

Development token for $target_user (HS256, aud $audience_demo, valid 1 h;
'scripts/demo.sh token [user]' prints a fresh one):
  $token

PostgreSQL (trust auth, local only):
  primary:      $bin/psql -h 127.0.0.1 -p $p_port -U postgres postgres
  sync replica: $bin/psql -h 127.0.0.1 -p $r_port -U postgres postgres -c 'SELECT powersync_mdbx.status()'

Open the sync stream (NDJSON lines: checkpoint, data, checkpoint_complete; it stays open):
  curl -sN --max-time 5 $endpoint/sync/stream \\
    -H 'Content-Type: application/json' -H 'Accept: application/x-ndjson' \\
    -H "Authorization: Token $token" \\
    -d '$sub_body'

Official SDK (@powersync/node) from this checkout (bash e2e/install.sh once):
  PSM_ENDPOINT=$endpoint PSM_JWT_SECRET=$secret \\
  PSM_USER=$target_user PSM_SUBSCRIBE=tasks_by_auth_project PSM_DB_DIR=$dir/client \\
  PSM_PRIMARY_URI=postgresql://postgres@127.0.0.1:$p_port/postgres \\
  $rel_dir/e2e/node_modules/.bin/node $rel_dir/e2e/client.mjs initial

In an app:
  import { PowerSyncDatabase } from '@powersync/node';
  const db = new PowerSyncDatabase({
    schema, // e2e/lib/schema.mjs describes the fixture's 'tasks' table
    database: { dbFilename: 'app.db', implementation: { type: 'node:sqlite' } }, // Node 22.13+
  });
  await db.connect({
    fetchCredentials: async () => ({ endpoint: '$endpoint', token: await tokenFromYourBackend() }),
    uploadData: async (db) => { /* send db.getNextCrudTransaction() to your backend */ },
  });
  await db.waitForFirstSync();
  (your backend signs HS256 tokens, kid psm-demo, aud $audience_demo, with the base64url
   key in $dir/jwt-secret; for a quick try, token: '<the token above>')

Ports, pids and the secret: $envfile
Status: scripts/demo.sh status      Stop: scripts/demo.sh stop
OUT
}

case "${1:-start}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  token) cmd_token "${2:-}" ;;
  -h|--help|help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown command '$1' (start, stop, status, token [user])" ;;
esac
