#!/usr/bin/env bash
# The image's HEALTHCHECK: healthy while the server accepts connections and the worker is
# ready to serve clients (status() `ready`). Prints the worker's phase; exits 1 otherwise.
# The test suite runs it against a live sync replica (e2e/testkit/tests/packaging.rs).
set -uo pipefail
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
line="$(psql -X -qAt -v ON_ERROR_STOP=1 --username "$user" --dbname "$db" \
  -c "SELECT (powersync_mdbx.status()->>'ready') || ' ' || (powersync_mdbx.status()->>'phase')" 2>&1)" || {
  echo "unhealthy: $line"
  exit 1
}
case "$line" in
  "true "*) echo "healthy: ${line#true }"; exit 0 ;;
  *) echo "unhealthy: phase ${line#* }"; exit 1 ;;
esac
