#!/usr/bin/env bash
# Builds the extension and installs it into the PostgreSQL whose pg_config is given:
#   scripts/install_extension.sh <pg_config> [--release]
# PostgreSQL 16 by default; a pg_config of PostgreSQL 15 builds for 15. The test command
# (scripts/test.sh) and the image (Dockerfile.pg16) both install with it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pg_config="${1:?usage: scripts/install_extension.sh <pg_config> [--release]}"
shift
major="$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
features=()
case "$major" in
  16) ;;
  15) features=(--no-default-features --features pg15) ;;
  *) echo "PostgreSQL $major is not supported (16, or 15)" >&2; exit 1 ;;
esac
cd "$root/extension"
cargo pgrx install "${features[@]}" --pg-config "$pg_config" "$@" >/dev/null
