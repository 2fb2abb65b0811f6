# Shared paths for the project's scripts. Source it; every value can be overridden.
# shellcheck shell=bash
PSM_TOOLS="${PSM_TOOLS:-/opt/powersync-mdbx}"
PSM_PG16_ROOT="${PSM_PG16_ROOT:-$PSM_TOOLS/pg16}"
PSM_PG16_BIN="${PSM_PG16_BIN:-$PSM_PG16_ROOT/pgserver/pginstall/bin}"
PSM_PG15_BIN="${PSM_PG15_BIN:-/usr/lib/postgresql/15/bin}"
# Unprivileged system user that runs throwaway clusters when the tests run as root.
PSM_TEST_USER="${PSM_TEST_USER:-powersync_test}"
PGRX_VERSION="0.18.1"
PGSERVER_VERSION="0.1.4"
export PSM_TOOLS PSM_PG16_ROOT PSM_PG16_BIN PSM_PG15_BIN PSM_TEST_USER
export PATH="$HOME/.cargo/bin:$PATH"
