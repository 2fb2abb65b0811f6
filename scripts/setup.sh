#!/usr/bin/env bash
# Prepares a fresh Debian 12 machine to build and test powersync_mdbx.
# Every step is idempotent and skipped when already done.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"

step() { printf '\n==> %s\n' "$*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# python3: the pgserver wheel is fetched with pip; the crate-graph and docs checks are Python.
# haproxy: the fleet test puts Debian's HAProxy in front of the replicas (its service is not
# used; the test runs its own process). docker-compose: the packaging test validates
# docker-compose.yml with `docker-compose config` (no Docker engine is needed for that).
# chromium: the web SDK's test drives its page in Debian's headless Chromium (puppeteer-core).
# e2fsprogs: the full-disk test makes a small ext4 file system (mkfs.ext4) on a loop device.
apt_packages=(clang libclang-dev pkg-config postgresql-15 postgresql-server-dev-15 python3 python3-pip haproxy docker-compose chromium e2fsprogs)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  step "apt: installing ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$PSM_PG16_BIN/pg_config" ]; then
  step "PostgreSQL 16 from the pgserver==$PGSERVER_VERSION wheel into $PSM_PG16_ROOT"
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps "pgserver==$PGSERVER_VERSION" -d "$tmp"
  as_root mkdir -p "$PSM_PG16_ROOT"
  as_root python3 -m zipfile -e "$tmp"/pgserver-*.whl "$PSM_PG16_ROOT"
  # zipfile drops the exec bits; the tree must also be readable by the test user.
  as_root chmod -R a+rX "$PSM_PG16_ROOT"
  as_root chmod a+x "$PSM_PG16_BIN"/*
  rm -rf "$tmp"
fi
"$PSM_PG16_BIN/pg_config" --version | grep -q '^PostgreSQL 16\.' \
  || { echo "error: $PSM_PG16_BIN/pg_config is not PostgreSQL 16" >&2; exit 1; }

# The primaries of the version matrix (PostgreSQL 13, 14, 17, 18; the replica stays 16).
"$here/install_primaries.sh"

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  step "cargo-pgrx $PGRX_VERSION (about 12 minutes on 2 cores, once per machine)"
  cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked --quiet
fi

pgrx_home="${PGRX_HOME:-$HOME/.pgrx}"
if ! grep -q "$PSM_PG16_BIN/pg_config" "$pgrx_home/config.toml" 2>/dev/null \
  || ! grep -q "$PSM_PG15_BIN/pg_config" "$pgrx_home/config.toml" 2>/dev/null; then
  step "cargo pgrx init (PostgreSQL 16 and 15, offline)"
  cargo pgrx init --pg16 "$PSM_PG16_BIN/pg_config" --pg15 "$PSM_PG15_BIN/pg_config" >/dev/null
fi

if [ "$(id -u)" -eq 0 ] && ! id "$PSM_TEST_USER" >/dev/null 2>&1; then
  step "system user $PSM_TEST_USER (PostgreSQL refuses to run as root)"
  useradd --system --no-create-home --shell /usr/sbin/nologin "$PSM_TEST_USER"
fi

# The end-to-end client (@powersync/node on Node.js 24 from the npm registry), about 5 s.
if ! command -v npm >/dev/null 2>&1; then
  step "apt: installing npm (for the end-to-end client)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq npm >/dev/null
fi
"$here/../e2e/install.sh"

step "machine ready"
