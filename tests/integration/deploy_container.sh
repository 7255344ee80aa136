#!/bin/sh
# deploy_container.sh: deploy/container/. With MGE_TEST_IMAGE=1 and a builder (podman, or a
# docker daemon) that has a debian:12 base image (nothing can be pulled), it builds the image
# and runs `mge-train --help` in it; otherwise it says why. Always, without an image:
#   * both package lists of the Containerfile resolve on a fresh Debian 12 (apt-get
#     --simulate against an empty dpkg status: every dependency comes from the mirror);
#   * every shared library the built binaries load belongs to a package the run-time list
#     installs (by its dependency closure), CUDA's own libraries excepted (CPU-only image);
#   * every -dev package deploy/install-deps.sh needs for the build is in the build list;
#     every COPY source exists;
#   * the entrypoint (sh -n, shellcheck when installed) run for real on this build
#     (MGE_BIN): `train --help`; `coordinator` and `worker` start the daemons from the
#     environment the k8s manifests set, and the worker registers with the slots
#     MGE_WORKER_CPUS and MGE_WORKER_MEMORY_MB gave it; a missing MGE_COORDINATOR or
#     token file exits 2 with the reason.
. "$(dirname "$0")/lib/control.sh"
CF=deploy/container/Containerfile
EP=deploy/container/entrypoint.sh
command -v apt-get >/dev/null 2>&1 || { echo "SKIP: apt-get not found (not Debian)"; exit 77; }

# ARG NAME="..." with continuation lines, from the Containerfile
arg_list() {
    sed -n "/^ARG $1=\"/,/\"\$/p" "$CF" | sed -e "s/^ARG $1=\"//" -e 's/["\\]//g' | tr -s ' \n' ' '
}
RUNTIME=$(arg_list RUNTIME_PKGS)
BUILDP=$(arg_list BUILD_PKGS)

# 0. a real image, where it can be built (MGE_TEST_IMAGE=1: minutes). The base image cannot
# be pulled here; make it from the Debian mirror first:
#   mmdebstrap --variant=minbase bookworm deb12.tar && podman import deb12.tar localhost/debian:12
builder=""
if command -v podman >/dev/null 2>&1 && podman image exists debian:12 2>/dev/null; then builder=podman
elif command -v docker >/dev/null 2>&1 && docker image inspect debian:12 >/dev/null 2>&1; then builder=docker
fi
if [ -n "$builder" ] && [ -n "$MGE_TEST_IMAGE" ]; then
    if $builder build --pull=never --network host -f "$CF" -t localhost/mge-test:latest . >"$T/build.log" 2>&1; then
        ok "$builder built the image from $CF"
        if $builder run --rm localhost/mge-test:latest >"$T/run.out" 2>&1 && grep -q usage "$T/run.out"; then
            ok "$builder run: the image's default command, train --help, runs mge-train"
        elif [ $builder = podman ] && mnt=$(podman image mount localhost/mge-test:latest) &&
            chroot --userspec=999:999 "$mnt" /usr/local/bin/mge-entrypoint train --help >"$T/run2.out" 2>&1 &&
            grep -q usage "$T/run2.out"; then
            # a sandbox without CAP_SYS_RESOURCE or with hybrid cgroups refuses crun itself
            ok "podman run refused here ($(grep -m1 -o 'crun: .*' "$T/run.out")); the image's files run 'mge-entrypoint train --help' as uid 999 under chroot"
            podman image unmount localhost/mge-test:latest >/dev/null 2>&1
        else
            fail "running the image: $(tail -n 3 "$T/run.out" "$T/run2.out" 2>/dev/null)"
        fi
    else
        fail "$builder build:"; tail -n 20 "$T/build.log"
    fi
else
    why="no podman or docker with a debian:12 base image here (nothing can be pulled)"
    [ -n "$builder" ] && why="$builder and debian:12 are here: MGE_TEST_IMAGE=1 builds it (minutes)"
    echo "note: image not built: $why"
fi

# 1. both package lists resolve on a fresh Debian 12 (needs apt's package lists)
if apt-cache show libuv1 >/dev/null 2>&1; then
    : >"$T/empty-status"
    for which in runtime build; do
        [ $which = runtime ] && pk=$RUNTIME || pk=$BUILDP
        # shellcheck disable=SC2086
        if apt-get install --simulate -y --no-install-recommends -o Dir::State::status="$T/empty-status" \
            $pk >"$T/sim-$which.out" 2>&1; then
            ok "$which packages resolve on an empty system: $(echo $pk | wc -w) asked, $(grep -c '^Inst' "$T/sim-$which.out") installed"
        else
            fail "$which packages do not resolve: $(grep '^E:' "$T/sim-$which.out")"
        fi
    done
    grep '^Inst' "$T/sim-runtime.out" | awk '{print $2}' | sort -u >"$T/closure"

    # 2. every library the binaries load comes with the run-time packages
    missing=""; n_libs=0; cuda=""
    for lib in $(for b in "$BIN"/*; do ldd "$b" 2>/dev/null | awk '$3 ~ /^\// {print $3}'; done | sort -u); do
        case $lib in /usr/local/cuda*) cuda="$cuda $(basename "$lib")"; continue ;; esac
        n_libs=$((n_libs + 1))
        pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null)
        pkg=${pkg%%:*}
        if [ -z "$pkg" ] || ! grep -qx "$pkg" "$T/closure"; then missing="$missing $(basename "$lib")(${pkg:-no package})"; fi
    done
    if [ -z "$missing" ]; then ok "the run-time packages provide all $n_libs libraries the binaries load"
    else fail "not provided by the run-time packages:$missing"; fi
    [ -n "$cuda" ] && echo "note: this build links CUDA from /usr/local/cuda ($cuda ); the image is built without it"
else
    echo "note: apt has no package lists (apt-get update): package checks skipped"
fi

# 3. the build list has install-deps' build packages; COPY sources exist
for p in $(sed -n '/^PKGS="/,/"$/p' deploy/install-deps.sh | tr -d '"' | sed 's/PKGS=//' | tr ' ' '\n' |
           grep -E -- '-dev$|^build-essential$|^pkg-config$|^protobuf-c-compiler$|^openmpi-bin$'); do
    case $p in libclang-rt-*) continue ;; esac  # fuzzing only
    case " $BUILDP " in *" $p "*) ;; *) fail "build package $p (install-deps.sh) missing from BUILD_PKGS" ;; esac
done
for src in $(awk '$1 == "COPY" && $2 !~ /^--from/ {print $2}' "$CF"); do
    [ -e "$src" ] || fail "COPY source '$src' does not exist"
done
ok "BUILD_PKGS has install-deps' build packages; COPY sources exist"

# 4. the entrypoint, for real on this build
if sh -n "$EP"; then ok "entrypoint: sh -n"; else fail "entrypoint: sh -n"; fi
if command -v shellcheck >/dev/null 2>&1; then
    if shellcheck "$EP" >"$T/sc.out" 2>&1; then ok "entrypoint: shellcheck clean"; else fail "shellcheck:"; cat "$T/sc.out"; fi
fi
ABS_BIN=$(cd "$BIN" && pwd)
if MGE_BIN=$ABS_BIN sh "$EP" train --help >"$T/train.out" 2>&1 && grep -q usage "$T/train.out"; then
    ok "entrypoint train --help runs mge-train"
else
    fail "entrypoint train --help: $(head -3 "$T/train.out")"
fi
MGE_BIN=$ABS_BIN MGE_TOKEN_FILE=$T/tokens MGE_JOIN_TOKEN_FILE=$T/join MGE_STATE_DIR=$T/state \
    MGE_COORDINATOR_OPTS="--listen 127.0.0.1:0 --worker-listen tcp://127.0.0.1:0 --ports-file $T/ports" \
    sh "$EP" coordinator >"$T/coordinator.log" 2>&1 &
PIDS="$PIDS $!"
wait_until 10 test -s "$T/ports" || { fail "entrypoint coordinator did not start"; exit 1; }
URL=http://$(sed -n 's/^http=//p' "$T/ports")
WORKER_URL=$(sed -n 's/^worker=//p' "$T/ports")
check "entrypoint coordinator: /healthz, state in MGE_STATE_DIR" sh -c "curl -sf $URL/healthz && test -f $T/state/mge.db"
mkdir -p "$T/w-ep"
MGE_BIN=$ABS_BIN MGE_COORDINATOR=$WORKER_URL MGE_JOIN_TOKEN_FILE=$T/join MGE_WORKER_NAME=ep-node \
    MGE_WORKER_CPUS=1 MGE_WORKER_MEMORY_MB=1500 MGE_WORK_DIR=$T/w-ep \
    MGE_LAUNCH_LISTEN=tcp://127.0.0.1:0 MGE_WORKER_OPTS="--heartbeat-ms 500" \
    sh "$EP" worker >"$T/worker.log" 2>&1 &
PIDS="$PIDS $!"
if wait_until 10 worker_ready ep-node; then
    slots=$(api GET /api/v1/workers | jq -c '.workers[] | select(.name == "ep-node") | [.slots.cpus, .slots.memory_mb]')
    [ "$slots" = "[1,1500]" ] && ok "entrypoint worker registered as ep-node with slots $slots (MGE_WORKER_CPUS, MGE_WORKER_MEMORY_MB)" ||
        fail "entrypoint worker slots $slots, expected [1,1500]"
else
    fail "entrypoint worker did not register"
fi
MGE_BIN=$ABS_BIN MGE_JOIN_TOKEN_FILE=$T/join sh "$EP" worker >"$T/noc.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q 'set MGE_COORDINATOR' "$T/noc.out" && ok "worker without MGE_COORDINATOR: exit 2, $(cat "$T/noc.out")" ||
    fail "worker without MGE_COORDINATOR: rc $rc: $(cat "$T/noc.out")"
MGE_BIN=$ABS_BIN MGE_TOKEN_FILE=$T/nonexistent sh "$EP" coordinator >"$T/notok.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "cannot read '$T/nonexistent'" "$T/notok.out" && ok "coordinator without its token file: exit 2, names the file" ||
    fail "coordinator without token file: rc $rc: $(cat "$T/notok.out")"

if [ "$fails" -eq 0 ]; then echo "deploy_container: all passed"; exit 0; fi
echo "deploy_container: $fails failed"; exit 1
