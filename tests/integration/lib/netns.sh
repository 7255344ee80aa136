# netns.sh: simulated nodes for the integration tests (sourced after control.sh, not run).
# Each node is a network namespace with its own address (a veth pair on a bridge in the root
# namespace) and, for what runs in it, its own UTS namespace (hostname nodeI), so Open MPI
# sees distinct hosts. Names carry this shell's pid (bridge mgebrPID, namespaces mgePID-nI,
# veths mgevPIDnI/mgepPIDnI) and the /24 is chosen per run, so parallel runs do not clash.
# Every namespace, veth and bridge made here, and every process in them, is removed on exit,
# also on failure or SIGINT. Exit 77 (skip) when not root or network namespaces do not work.
[ "$(id -u)" -eq 0 ] || { echo "SKIP: network namespaces need root"; exit 77; }
command -v ip >/dev/null 2>&1 || { echo "SKIP: ip (iproute2) not installed"; exit 77; }
command -v unshare >/dev/null 2>&1 || { echo "SKIP: unshare (util-linux) not installed"; exit 77; }

NETNS_BR=mgebr$$
NETNS_N=0      # nodes made so far
NETNS_NET=""   # 10.A.B (the /24 without its last byte), chosen by netns_setup
NETNS_LOCK=/run/lock/mge-netns.lock

# netns_name I / netns_veth I / netns_addr I: node I's namespace, root-side veth, address
netns_name() { echo "mge$$-n$1"; }
netns_veth() { echo "mgev$$n$1"; }
netns_addr() { echo "$NETNS_NET.$(($1 + 1))"; }

netns_cleanup() {
    i=1
    while [ "$i" -le "$NETNS_N" ]; do
        ns=$(netns_name "$i")
        # SIGKILL ends stopped processes too; a namespace's processes keep it alive otherwise
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
        ip link del "$(netns_veth "$i")" 2>/dev/null
        i=$((i + 1))
    done
    ip link del "$NETNS_BR" 2>/dev/null
}
# namespaces first (their processes hold the veths), then control.sh's processes and files
trap 'netns_cleanup; cleanup' EXIT

# netns_setup N: the bridge with NETNS_NET.1/24 and nodes 1..N (NETNS_NET.2 ...), lo up.
# Exits 77 when a namespace cannot be made (no CAP_SYS_ADMIN in a container, no kernel support).
netns_setup() {
    if ! ip netns add "mge$$-probe" 2>/dev/null; then
        echo "SKIP: cannot create a network namespace here"; exit 77
    fi
    ip netns del "mge$$-probe"
    ip link add "$NETNS_BR" type bridge || { fail "cannot create bridge $NETNS_BR"; exit 1; }
    # a /24 no interface uses yet; the lock keeps two runs from taking the same one
    mkdir -p "$(dirname "$NETNS_LOCK")"
    exec 9>"$NETNS_LOCK"
    flock 9
    k=0
    while [ "$k" -lt 200 ]; do
        net=10.$((200 + ($$ / 250 + k) % 50)).$(( ($$ + k) % 250 + 1 ))
        if ! ip -4 -o addr show | grep -q " $net\."; then
            NETNS_NET=$net
            break
        fi
        k=$((k + 1))
    done
    [ -n "$NETNS_NET" ] && ip addr add "$NETNS_NET.1/24" dev "$NETNS_BR"
    flock -u 9
    exec 9>&-
    [ -n "$NETNS_NET" ] || { fail "no free 10.x.y.0/24 for the bridge"; exit 1; }
    ip link set "$NETNS_BR" up
    i=1
    while [ "$i" -le "$1" ]; do
        ns=$(netns_name "$i")
        v=$(netns_veth "$i")
        NETNS_N=$i
        ip netns add "$ns" &&
            ip link add "$v" type veth peer name "mgep$$n$i" &&
            ip link set "mgep$$n$i" netns "$ns" &&
            ip link set "$v" master "$NETNS_BR" &&
            ip link set "$v" up &&
            ip -n "$ns" addr add "$(netns_addr "$i")/24" dev "mgep$$n$i" &&
            ip -n "$ns" link set "mgep$$n$i" up &&
            ip -n "$ns" link set lo up || { fail "cannot set up node $i ($ns)"; exit 1; }
        i=$((i + 1))
    done
    NETNS_CIDR=$NETNS_NET.0/24
    NETNS_HOST=$NETNS_NET.1
}

# netns_exec I COMMAND...: exec COMMAND in node I with hostname nodeI (its own UTS
# namespace). Replaces the calling shell: run it in the background (`netns_exec 1 cmd &`) and $!
# is COMMAND's pid.
netns_exec() {
    i=$1; shift
    exec ip netns exec "$(netns_name "$i")" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
        "node$i" "$@"
}

# netns_kill I [SIGNAL]: send SIGNAL (default KILL) to every process of node I
netns_kill() {
    for p in $(ip netns pids "$(netns_name "$1")"); do kill -"${2:-KILL}" "$p" 2>/dev/null; done
}

# netns_link I up|down: node I's link to the bridge
netns_link() { ip link set "$(netns_veth "$1")" "$2"; }
