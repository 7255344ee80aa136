#!/bin/sh
# deploy_systemd.sh: the systemd units in deploy/systemd/ are valid, hardened, and start the
# real daemons. 1. `systemd-analyze verify` on every unit (ExecStart pointed at this build):
# no output at all (it exits 0 even for an unknown key, so any line fails the test); a copy
# with a misspelt key must be reported (the check can fail). 2. `systemd-analyze security
# --offline` exposure at most 3.0 ("OK") per unit. 3. The sysusers.d file creates user mge
# (systemd-sysusers --root on a scratch tree). 4. Each unit's ExecStart, expanded as systemd
# would with the shipped example env files (addresses overridden for loopback), starts the
# coordinator and a worker that registers under the unit's name: flags and files line up.
# Skips visibly without systemd-analyze (deploy/install-deps.sh installs systemd).
. "$(dirname "$0")/lib/control.sh"
UNITS=deploy/systemd
PY=/usr/bin/python3
command -v systemd-analyze >/dev/null 2>&1 || { echo "SKIP: systemd-analyze not installed (Debian package systemd)"; exit 77; }
[ -x $PY ] || { echo "SKIP: $PY not installed"; exit 77; }
ABS_BIN=$(cd "$BIN" && pwd)

# 1. verify, on copies whose ExecStart is this build's binary (verify checks it is executable)
mkdir -p "$T/units" "$T/bad"
for u in "$UNITS"/*.service; do
    sed "s|/usr/local/bin/|$ABS_BIN/|" "$u" >"$T/units/$(basename "$u")"
done
n_units=$(ls "$T/units" | wc -l)
[ "$n_units" -ge 2 ] || fail "expected the coordinator and worker units, found $n_units"
if systemd-analyze verify "$T"/units/*.service >"$T/verify.out" 2>&1 && [ ! -s "$T/verify.out" ]; then
    ok "systemd-analyze verify: $n_units units, no warnings"
else
    fail "systemd-analyze verify:"; cat "$T/verify.out"
fi
sed 's/^NoNewPrivileges=/NoNewPrivilege=/' "$T/units/mge-worker.service" >"$T/bad/mge-worker.service"
systemd-analyze verify "$T/bad/mge-worker.service" >"$T/bad.out" 2>&1
check "verify reports a misspelt key ($(head -c 80 "$T/bad.out"))" grep -q "Unknown key 'NoNewPrivilege'" "$T/bad.out"
sed "s|^ExecStart=$ABS_BIN/|ExecStart=/nonexistent/|" "$T/units/mge-coordinator.service" >"$T/bad/mge-coordinator.service"
systemd-analyze verify "$T/bad/mge-coordinator.service" >"$T/bad2.out" 2>&1
check "verify reports a missing binary" grep -q "not executable" "$T/bad2.out"

# 2. exposure (systemd-analyze security: 0 most locked down, 10 not at all; --threshold is
# in tenths)
for u in "$T"/units/*.service; do
    if systemd-analyze security --offline=yes --threshold=30 "$u" >"$T/sec.out" 2>&1; then
        ok "$(grep -o 'Overall exposure level for .*' "$T/sec.out")"
    else
        fail "$(basename "$u"): exposure above 3.0:"; grep -E '^✗|Overall' "$T/sec.out" | tail -n 25
    fi
done
for key in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes PrivateTmp=yes \
           Restart=on-failure User=mge; do
    for u in "$UNITS"/*.service; do
        grep -qx "$key" "$u" || fail "$(basename "$u") lacks $key"
    done
done
for u in "$UNITS"/*.service; do
    grep -q '^StateDirectory=' "$u" || fail "$(basename "$u") has no StateDirectory="
done

# 3. the sysusers.d file creates a system user mge with no login shell
mkdir -p "$T/root/etc"
if systemd-sysusers --root="$T/root" "$PWD/$UNITS/mge.sysusers.conf" >"$T/sysusers.out" 2>&1; then
    line=$(grep '^mge:' "$T/root/etc/passwd")
    uid=$(echo "$line" | cut -d: -f3)
    if [ -n "$line" ] && [ "$uid" -lt 1000 ] && echo "$line" | grep -q ':/usr/sbin/nologin$'; then
        ok "sysusers creates the system user: $line"
    else
        fail "sysusers: passwd line '$line'"
    fi
else
    fail "systemd-sysusers: $(cat "$T/sysusers.out")"
fi

# 4. the units' command lines start the real daemons (example env files + loopback overrides)
mkdir -p "$T/cred" "$T/sroot"
cp "$T/tokens" "$T/cred/tokens"; cp "$T/join" "$T/cred/join"
cat >"$T/coord-override.env" <<EOT
MGE_LISTEN=127.0.0.1:0
MGE_WORKER_LISTEN=tcp://127.0.0.1:0
EOT
$PY tests/integration/lib/unit_exec.py "$UNITS/mge-coordinator.service" "$ABS_BIN" "$T/cred" \
    "$T/sroot" unit-host "$UNITS/coordinator.env" "$T/coord-override.env" \
    -- --ports-file "$T/ports" >"$T/coordinator.log" 2>&1 &
PIDS="$PIDS $!"
wait_until 10 test -s "$T/ports" || { fail "the coordinator unit's command did not start"; exit 1; }
URL=http://$(sed -n 's/^http=//p' "$T/ports")
WORKER_URL=$(sed -n 's/^worker=//p' "$T/ports")
check "coordinator from the unit answers /healthz" curl -sf "$URL/healthz"
check "its state is in the unit's StateDirectory (%S/mge)" test -f "$T/sroot/mge/mge.db"
cat >"$T/worker-override.env" <<EOT
MGE_COORDINATOR=$WORKER_URL
MGE_LAUNCH_LISTEN=tcp://127.0.0.1:0
EOT
mkdir -p "$T/sroot/mge-worker"  # systemd creates StateDirectory= before ExecStart
$PY tests/integration/lib/unit_exec.py "$UNITS/mge-worker.service" "$ABS_BIN" "$T/cred" \
    "$T/sroot" unit-host "$UNITS/worker.env" "$T/worker-override.env" \
    -- --heartbeat-ms 500 >"$T/worker.log" 2>&1 &
PIDS="$PIDS $!"
# the unit's default name is %H, the host name
if wait_until 10 worker_ready unit-host; then ok "worker from the unit registered as 'unit-host' (%H)"
else fail "worker from the unit did not register"; fi
# tokens reach the daemons as files in the credentials directory (%d), never on argv
for p in $PIDS; do
    cmd=$(tr '\0' ' ' <"/proc/$p/cmdline")
    case $cmd in
        *adm-secret* | *ro-secret* | *join-secret*) fail "a token is on the command line: $cmd" ;;
        *"--join-token-file $T/cred/join"*) ok "pid $p: no token on its command line, join token from %d" ;;
        *) fail "pid $p: unexpected command line: $cmd" ;;
    esac
done
if [ "$fails" -eq 0 ]; then echo "deploy_systemd: all passed"; exit 0; fi
echo "deploy_systemd: $fails failed"; exit 1
