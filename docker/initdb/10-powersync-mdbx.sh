#!/usr/bin/env bash
# Run once by the postgres image on a new data directory (/docker-entrypoint-initdb.d):
# creates the extension, whose SQL functions (status(), reset(), ...) the operator uses.
# The test suite runs it against a live sync replica (e2e/testkit/tests/packaging.rs).
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER:-postgres}" \
  --dbname "${POSTGRES_DB:-${POSTGRES_USER:-postgres}}" \
  -c 'CREATE EXTENSION IF NOT EXISTS powersync_mdbx'
