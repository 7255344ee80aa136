#!/bin/sh
# entrypoint.sh: the mge image's entrypoint. The first argument picks the program; the rest
# are its flags, after the defaults below (a flag given again wins: both daemons take the
# last value).
#   coordinator [FLAGS]   mge-coordinator, REST API on 0.0.0.0:8080, worker link on :7070
#   worker [FLAGS]        mge-worker; MGE_COORDINATOR (tcp://HOST:7070) is required
#   train SPEC [FLAGS]    mge-train, the engine alone (no daemons; also under mpirun/srun)
#   mgectl ARGS | mge-* ARGS | any other command   run as given
# Settings from the environment (defaults in brackets); tokens only ever as files:
#   MGE_STATE_DIR [/var/lib/mge]   MGE_TOKEN_FILE [/etc/mge/tokens]
#   MGE_JOIN_TOKEN_FILE [/etc/mge/join]   MGE_WEB_ROOT [/usr/local/share/mge/web]
#   MGE_COORDINATOR_OPTS (more coordinator flags)
#   MGE_COORDINATOR   MGE_WORKER_NAME [host name]   MGE_WORK_DIR [/var/lib/mge-worker]
#   MGE_LAUNCH_LISTEN [tcp://0.0.0.0:7071]   MGE_WORKER_CPUS, MGE_WORKER_MEMORY_MB [all
#   of the machine's]   MGE_WORKER_OPTS (more worker flags)
#   MGE_BIN [/usr/local/bin]: where the binaries are (tests run this script on a build tree)
set -eu
BIN=${MGE_BIN:-/usr/local/bin}
die() { echo "mge-entrypoint: $*" >&2; exit 2; }
[ $# -ge 1 ] || die "usage: entrypoint.sh coordinator|worker|train|COMMAND [ARGS...]"
what=$1
shift
case $what in
coordinator)
    for f in "${MGE_TOKEN_FILE:=/etc/mge/tokens}" "${MGE_JOIN_TOKEN_FILE:=/etc/mge/join}"; do
        [ -r "$f" ] || die "cannot read '$f' (mount the tokens there, or set MGE_TOKEN_FILE / MGE_JOIN_TOKEN_FILE)"
    done
    # shellcheck disable=SC2086 # MGE_COORDINATOR_OPTS is a list of flags
    exec "$BIN/mge-coordinator" --listen 0.0.0.0:8080 --worker-listen tcp://0.0.0.0:7070 \
        --state-dir "${MGE_STATE_DIR:-/var/lib/mge}" --token-file "$MGE_TOKEN_FILE" \
        --join-token-file "$MGE_JOIN_TOKEN_FILE" \
        --web-root "${MGE_WEB_ROOT:-/usr/local/share/mge/web}" ${MGE_COORDINATOR_OPTS:-} "$@"
    ;;
worker)
    [ -n "${MGE_COORDINATOR:-}" ] || die "set MGE_COORDINATOR to the coordinator's worker link (tcp://HOST:7070)"
    [ -r "${MGE_JOIN_TOKEN_FILE:=/etc/mge/join}" ] ||
        die "cannot read '$MGE_JOIN_TOKEN_FILE' (mount the join token there, or set MGE_JOIN_TOKEN_FILE)"
    # shellcheck disable=SC2086 # MGE_WORKER_OPTS is a list of flags
    set -- --coordinator "$MGE_COORDINATOR" --join-token-file "$MGE_JOIN_TOKEN_FILE" \
        --name "${MGE_WORKER_NAME:-$(hostname)}" --work-dir "${MGE_WORK_DIR:-/var/lib/mge-worker}" \
        --launch-listen "${MGE_LAUNCH_LISTEN:-tcp://0.0.0.0:7071}" \
        ${MGE_WORKER_CPUS:+--cpus "$MGE_WORKER_CPUS"} \
        ${MGE_WORKER_MEMORY_MB:+--memory-mb "$MGE_WORKER_MEMORY_MB"} ${MGE_WORKER_OPTS:-} "$@"
    exec "$BIN/mge-worker" "$@"
    ;;
train)
    exec "$BIN/mge-train" "$@"
    ;;
mgectl | mge-*)
    exec "$BIN/$what" "$@"
    ;;
*)
    exec "$what" "$@"
    ;;
esac
