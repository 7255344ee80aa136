#!/bin/sh
# run.sh BUILD: the dashboard in a real browser (tests/e2e/dashboard.mjs): Debian's Chromium
# driven by playwright-core (from coordinator/web's lock file), real mge-coordinator,
# mge-worker and mge-train on loopback. Exit 0 pass, 77 skip (said why), else fail.
# Screenshots and measurements go to BUILD/e2e-artifacts/. Installs nothing but `npm ci`
# from the committed lock file (offline when npm's cache has the packages).
BUILD=${1:-build}
CHROMIUM=${MGE_CHROMIUM:-/usr/bin/chromium}
skip() { echo "SKIP: $*"; exit 77; }
command -v node >/dev/null 2>&1 || skip "node not installed (apt-get install nodejs npm)"
[ -x "$CHROMIUM" ] || skip "$CHROMIUM not installed (apt-get install chromium)"
for b in mge-coordinator mge-worker mge-train; do
    [ -x "$BUILD/bin/$b" ] || skip "$BUILD/bin/$b not built"
done
if [ ! -f "$BUILD/web/index.html" ] || [ ! -d coordinator/web/node_modules/playwright-core ]; then
    sh coordinator/web/build.sh "$BUILD/web"
fi
[ -f "$BUILD/web/index.html" ] || skip "the dashboard is not built (npm unavailable or npm ci failed)"
[ -d coordinator/web/node_modules/playwright-core ] || skip "playwright-core not installed (npm ci in coordinator/web)"
exec node tests/e2e/dashboard.mjs "$BUILD" "$CHROMIUM"
