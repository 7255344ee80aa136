#!/bin/sh
# build.sh OUTDIR: build the dashboard into OUTDIR (make web calls it). Installs the npm
# packages from the committed lock file when node_modules is missing or stale (`npm ci`,
# offline when npm's cache has them). Without node/npm it says so and leaves the C build be.
out=$1
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
cd "$(dirname "$0")" || exit 1
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "  WEB     skipped: node/npm not installed (dashboard not built; the daemons work without it)"
    exit 0
fi
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    echo "  NPM     ci (coordinator/web/package-lock.json)"
    if ! npm ci --no-audit --no-fund --prefer-offline --loglevel=error; then
        echo "  WEB     skipped: npm ci failed (offline with an empty npm cache?); dashboard not built"
        exit 0
    fi
fi
exec node build.mjs "$out"
