#!/bin/sh
# control_over_tls.sh: control-plane tests again with the coordinator serving HTTPS and the
# worker link over tls+tcp:// (MGE_TEST_TLS=1, see lib/control.sh: certificates made by
# openssl; curl, mgectl and the workers given the CA). Kept short for make test; any other
# control_*.sh runs the same way: MGE_TEST_TLS=1 sh tests/integration/X.sh build
# (control_restart.sh and control_worker_lost.sh pass so too, ~20 s each).
BUILD=${1:-build}
command -v openssl >/dev/null 2>&1 || { echo "SKIP: openssl not installed"; exit 77; }
rc=0
for t in control_api control_openapi; do
    echo "-- $t.sh with MGE_TEST_TLS=1"
    MGE_TEST_TLS=1 sh "$(dirname "$0")/$t.sh" "$BUILD"
    r=$?
    [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
done
exit $rc
