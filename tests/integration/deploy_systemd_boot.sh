#!/bin/sh
# deploy_systemd_boot.sh: the systemd units under a real systemd (opt-in: MGE_TEST_NSPAWN=1,
# about 2 minutes; it downloads a Debian 12 root file system from the mirror). Boots
# Debian 12 with systemd-nspawn (private network), installs the units, the sysusers.d file,
# the env files and tokens as docs/operations.md says, with two worker units, then checks:
# both daemons run as user mge with no capabilities, no_new_privs and a seccomp filter, their
# tokens come from /run/credentials; a job and a 2-worker MPI job (mpirun, orted started
# through the other worker unit's launch socket) succeed inside the sandbox; kill -9 of the
# coordinator is restarted by Restart=on-failure and answers /healthz again; a stop is clean
# (the WAL is checkpointed and removed).
# Skips visibly unless MGE_TEST_NSPAWN=1, root, systemd-nspawn and mmdebstrap.
. "$(dirname "$0")/lib/control.sh"
[ -n "$MGE_TEST_NSPAWN" ] || { echo "SKIP: set MGE_TEST_NSPAWN=1 to boot the units under systemd-nspawn (about 2 min, needs the Debian mirror)"; exit 77; }
[ "$(id -u)" -eq 0 ] || { echo "SKIP: systemd-nspawn needs root"; exit 77; }
for tool in systemd-nspawn mmdebstrap nsenter; do
    command -v $tool >/dev/null 2>&1 || { echo "SKIP: $tool not installed (Debian: systemd-container, mmdebstrap)"; exit 77; }
done
R=$T/root
PKGS=$(sed -n '/^ARG RUNTIME_PKGS="/,/"$/p' deploy/container/Containerfile | sed -e 's/^ARG RUNTIME_PKGS="//' -e 's/["\\]//g' | tr -s ' \n' ',')
if ! mmdebstrap --variant=minbase --mode=root --include="systemd,systemd-sysv,dbus,curl,${PKGS%,}" \
    bookworm "$R" "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" >"$T/mmdebstrap.log" 2>&1; then
    fail "mmdebstrap: $(tail -n 3 "$T/mmdebstrap.log")"; exit 1
fi
ok "Debian 12 root with systemd and the run-time packages"
cp "$BIN"/mge-* "$BIN"/mgectl "$R/usr/local/bin/"
if [ -d /usr/local/cuda ]; then  # this build may link CUDA's run-time libraries
    mkdir -p "$R/usr/local/cuda"
    echo /usr/local/cuda/lib64 >"$R/etc/ld.so.conf.d/cuda.conf"
    set -- --bind-ro=/usr/local/cuda
else
    set --
fi
install -m 644 deploy/systemd/mge.sysusers.conf "$R/usr/lib/sysusers.d/mge.conf"
install -m 644 deploy/systemd/mge-coordinator.service deploy/systemd/mge-worker.service "$R/etc/systemd/system/"
# a second worker unit on the same machine (names, launch port, state directory differ)
sed -e 's|/etc/mge/worker.env|/etc/mge/worker2.env|' -e 's|^StateDirectory=mge-worker$|StateDirectory=mge-worker2|' \
    -e 's|%S/mge-worker |%S/mge-worker2 |' deploy/systemd/mge-worker.service >"$R/etc/systemd/system/mge-worker2.service"
install -d -m 755 "$R/etc/mge"
(umask 077; printf 'admin %s\n' "$ADMIN" >"$R/etc/mge/tokens"; cat "$T/join" >"$R/etc/mge/join")
sed -e 's|^MGE_LISTEN=.*|MGE_LISTEN=127.0.0.1:8080|' -e 's|^MGE_WORKER_LISTEN=.*|MGE_WORKER_LISTEN=tcp://127.0.0.1:7070|' \
    deploy/systemd/coordinator.env >"$R/etc/mge/coordinator.env"
# one host, so MPI's TCP goes over loopback (Open MPI skips lo unless told)
sed -e 's|^MGE_COORDINATOR=.*|MGE_COORDINATOR=tcp://127.0.0.1:7070|' \
    -e 's|^MGE_WORKER_OPTS=.*|MGE_WORKER_OPTS=--cpus 2 --mpi-if 127.0.0.0/8|' deploy/systemd/worker.env >"$R/etc/mge/worker.env"
sed -e 's|^MGE_LAUNCH_LISTEN=.*|MGE_LAUNCH_LISTEN=tcp://0.0.0.0:7072|' -e 's|^#MGE_WORKER_NAME=.*|MGE_WORKER_NAME=box2|' \
    "$R/etc/mge/worker.env" >"$R/etc/mge/worker2.env"
for u in mge-coordinator mge-worker mge-worker2; do
    ln -sf "/etc/systemd/system/$u.service" "$R/etc/systemd/system/multi-user.target.wants/$u.service"
done
echo box >"$R/etc/hostname"
echo "127.0.1.1 box" >>"$R/etc/hosts"  # the workers advertise their host name
systemd-nspawn -D "$R" --register=no --keep-unit --private-network "$@" -b >"$T/boot.log" 2>&1 &
NSPAWN=$!
PIDS="$PIDS $NSPAWN"
leader() { ps -eo pid=,ppid= | awk -v p="$NSPAWN" '$2 == p {print $1; exit}'; }
wait_until 30 sh -c "[ -n \"\$(ps -eo pid=,ppid= | awk -v p=$NSPAWN '\$2 == p')\" ]"
L=$(leader)
[ -n "$L" ] || { fail "systemd-nspawn did not boot: $(tail -n 5 "$T/boot.log")"; exit 1; }
N="nsenter -t $L -a"
units_active() { for u in mge-coordinator mge-worker mge-worker2; do $N systemctl is-active -q $u || return 1; done; }
if wait_until 60 units_active; then ok "systemd booted; mge-coordinator, mge-worker, mge-worker2 active"
else fail "units not active: $($N systemctl --no-pager status mge-coordinator mge-worker 2>&1 | tail -n 20)"; exit 1; fi
for u in mge-coordinator mge-worker; do
    p=$($N systemctl show -p MainPID --value $u)
    st=$($N grep -E '^(Uid|NoNewPrivs|Seccomp|CapEff):' "/proc/$p/status" | awk '{print $1 $2}' | tr '\n' ' ')
    user=$($N stat -c %U "/proc/$p")
    case "$user $st" in
        "mge Uid:"*"CapEff:0000000000000000 NoNewPrivs:1 Seccomp:2 ") ok "$u runs as mge: $st" ;;
        *) fail "$u: user $user, $st" ;;
    esac
    $N cat "/proc/$p/cmdline" | tr '\0' ' ' | grep -q -- "-file /run/credentials/$u.service/" &&
        ok "$u reads its tokens from /run/credentials/$u.service/" || fail "$u: tokens not from its credentials"
done
MG="$N env MGE_SERVER=http://127.0.0.1:8080 MGE_TOKEN=$ADMIN mgectl"
both_ready() { [ "$($MG workers 2>/dev/null | grep -c ' ready ')" -eq 2 ]; }
wait_until 20 both_ready || fail "two workers did not register: $($MG workers 2>&1)"
cat >"$R/root/one.yaml" <<'Y'
name: unit-one
model: {type: mlp, hidden: [64, 32]}
data: {format: synthetic, input_dim: 100, classes: 20, train_size: 1003, test_size: 200}
train: {steps: 300, batch_size: 50, optimizer: {type: sgd, lr: 0.01, momentum: 0.9}, seed: 7}
Y
sed -e 's/unit-one/unit-two/' "$R/root/one.yaml" >"$R/root/two.yaml"
echo "resources: {workers: 2, cpus: 1}" >>"$R/root/two.yaml"
for j in one two; do
    if timeout 120 $MG submit "/root/$j.yaml" -f >"$T/$j.out" 2>&1; then
        ok "job $j.yaml succeeded under the units: $(grep -m1 -o 'test loss [0-9.]*' "$T/$j.out")"
    else
        fail "job $j.yaml: $(tail -n 3 "$T/$j.out")"
        $MG logs "$(grep -m1 -o 'job [0-9]*' "$T/$j.out" | cut -d' ' -f2)" 2>&1 | grep -v '^{' | tail -n 15
    fi
done
p=$($N systemctl show -p MainPID --value mge-coordinator)
$N sh -c "kill -9 $p"
restarted() { [ "$($N systemctl show -p NRestarts --value mge-coordinator)" = 1 ] && $N curl -sf http://127.0.0.1:8080/healthz; }
if wait_until 20 restarted; then ok "kill -9 of the coordinator: Restart=on-failure brought it back, /healthz answers"
else fail "coordinator not restarted: $($N systemctl show -p NRestarts -p ActiveState mge-coordinator)"; fi
$N systemctl stop mge-coordinator
if $N test -f /var/lib/mge/mge.db && ! $N test -e /var/lib/mge/mge.db-wal; then
    ok "systemctl stop is clean: the WAL was checkpointed into mge.db and removed"
else
    fail "after stop: $($N ls /var/lib/mge)"
fi
if [ "$fails" -eq 0 ]; then echo "deploy_systemd_boot: all passed"; exit 0; fi
echo "deploy_systemd_boot: $fails failed"; exit 1
