#!/usr/bin/env bash
# The udp backend's throughput, side by side in one run: ours (flanneld starting flannel-udp,
# release build), Go's flanneld v0.20.2 (its udp proxy runs inside flanneld), and the kernel's
# vxlan (flannel's vxlan backend's data path, the ceiling of what the namespaces carry). Two
# "nodes" (namespaces) on a veth, etcd on the first; each daemon takes its lease there with
# `{"Backend":{"Type":"udp"}}` and makes flannel0 as it does on a node; a "pod" namespace sits
# behind each node in the subnet the lease gave, at the MTU subnet.env says. Rounds interleave
# the implementations, so load from elsewhere falls on all of them alike.
#   scripts/bench-udp.sh [seconds (default 10)] [rounds (default 3)]
# For each round: iperf3 TCP throughput pod to pod; the CPU seconds per Gbit carried of the
# processes that carry it (ours: flannel-udp and flanneld on both nodes; Go's: flanneld on both);
# iperf3's share of the machine (all cores); the share of the machine busy in all.
# IMPLS="ours go vxlan" picks them; OURS_DIR=<dir> takes flanneld and flannel-udp from there (no
# build); FLANNELD_GO=<binary> names Go's (default ../shared/reference/flanneld-v0.20.2, as the
# tests find it).
# Needs root, etcd and iperf3; it makes only namespaces (and removes them), never touches the
# root namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark creates network namespaces" >&2; exit 1; }
for t in etcd etcdctl iperf3 python3 ping; do
    command -v $t >/dev/null || { echo "missing $t: apt-get install etcd-server etcd-client iperf3 python3 iputils-ping" >&2; exit 1; }
done
secs=${1:-10}
rounds=${2:-3}
impls=${IMPLS:-ours go vxlan}
go=${FLANNELD_GO:-$PWD/../shared/reference/flanneld-v0.20.2}
# a worktree under /work/wt/<name> finds it beside the checkout it belongs to
[ -n "${FLANNELD_GO:-}" ] || [ -x "$go" ] || go=$PWD/../../shared/reference/flanneld-v0.20.2
if [[ " $impls " == *" go "* ]] && [ ! -x "$go" ]; then
    echo "Go's flanneld v0.20.2 is not at $go: FLANNELD_GO names it" >&2
    exit 1
fi
if [ -z "${OURS_DIR:-}" ]; then
    cargo build --release --locked --quiet -p flanneld -p flannel-udp
fi
ours=${OURS_DIR:-$PWD/target/release}

tag=udpb$$
nsa=$tag-a nsb=$tag-b pa=$tag-pa pb=$tag-pb
work=$(mktemp -d)
etcd_url=http://192.168.77.1:2379
daemons=() etcd_pid=""
stop_daemons() {
    local p
    for p in "${daemons[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${daemons[@]}"; do
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    daemons=()
}
cleanup() {
    stop_daemons
    [ -z "$etcd_pid" ] || { kill "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; }
    for n in $nsa $nsb $pa $pb; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add $nsa
ip netns add $nsb
ip -n $nsa link add ul type veth peer name ul netns $nsb
ip -n $nsa addr add 192.168.77.1/24 dev ul
ip -n $nsb addr add 192.168.77.2/24 dev ul
for n in $nsa $nsb; do
    ip -n $n link set ul up
    ip -n $n link set lo up
    ip netns exec $n sysctl -qw net.ipv4.ip_forward=1
done
ip netns exec $nsa etcd --data-dir "$work/etcd" \
    --listen-client-urls $etcd_url --advertise-client-urls $etcd_url \
    --listen-peer-urls http://127.0.0.1:2380 >"$work/etcd.log" 2>&1 &
etcd_pid=$!
etcdctl_() { ip netns exec $nsa etcdctl --endpoints=$etcd_url "$@"; }
for _ in $(seq 200); do etcdctl_ endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
etcdctl_ put /coreos.com/network/config '{"Network":"10.77.0.0/16","Backend":{"Type":"udp"}}' >/dev/null

# A pod namespace behind node namespace ns: its veth's node end holds address/prefix, the pod
# the next address (left in pod_ip), both at mtu.
setup_pod() {
    local ns=$1 pod=$2 cidr=$3 mtu=$4
    local host=${cidr%/*} prefix=${cidr#*/}
    pod_ip=${host%.*}.$((${host##*.} + 1))
    ip netns add "$pod"
    ip -n "$ns" link add "$tag-p" type veth peer name eth0 netns "$pod"
    ip -n "$ns" addr add "$cidr" dev "$tag-p"
    ip -n "$ns" link set "$tag-p" mtu "$mtu" up
    ip -n "$pod" addr add "$pod_ip/$prefix" dev eth0
    ip -n "$pod" link set eth0 mtu "$mtu" up
    ip -n "$pod" link set lo up
    ip -n "$pod" route add default via "$host"
}

# env_value file key: a subnet.env's value
env_value() { sed -n "s/^$2=//p" "$1"; }

# Starts implementation impl's daemon on node ns (number n); waits for its subnet.env.
start_daemon() {
    local impl=$1 ns=$2 n=$3
    local env=$work/$n.env dir=$work/$n
    mkdir -p "$dir"
    rm -f "$env"
    local bin=$go
    [ "$impl" = ours ] && bin=$ours/flanneld
    FLANNEL_UDP_SOCKET_DIR=$dir ip netns exec "$ns" "$bin" --etcd-endpoints $etcd_url \
        --iface ul --subnet-file "$env" >>"$work/$impl-$n.log" 2>&1 &
    daemons+=($!)
    for _ in $(seq 600); do [ -s "$env" ] && return; sleep 0.1; done
    echo "$impl: no subnet.env on node $n after 60 s; its log:" >&2
    tail -20 "$work/$impl-$n.log" >&2
    exit 1
}

# The pids of the processes named comm in namespace ns.
pids_in() { for p in $(ip netns pids "$1"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = "$2" ] && echo "$p"; done; true; }

# Brings implementation impl up between the nodes and pods; pod b's address is then in pod_ip.
bring_up() {
    local impl=$1
    if [ "$impl" = vxlan ]; then
        local n m ns
        for n in 1 2; do
            m=$((3 - n)) ns=$nsa
            [ $n = 2 ] && ns=$nsb
            ip -n $ns link add flannel.1 type vxlan id 1 local 192.168.77.$n remote 192.168.77.$m dstport 8472 dev ul
            ip -n $ns addr add 10.77.$n.0/32 dev flannel.1
            ip -n $ns link set flannel.1 mtu 1450 up
            ip -n $ns route add 10.77.$m.0/24 via 10.77.$m.0 dev flannel.1 onlink
        done
        ip -n $nsa neigh add 10.77.2.0 lladdr "$(ip -n $nsb -br link show flannel.1 | awk '{print $3}')" dev flannel.1
        ip -n $nsb neigh add 10.77.1.0 lladdr "$(ip -n $nsa -br link show flannel.1 | awk '{print $3}')" dev flannel.1
        setup_pod $nsa $pa 10.77.1.1/24 1450
        setup_pod $nsb $pb 10.77.2.1/24 1450
        return
    fi
    etcdctl_ del --prefix /coreos.com/network/subnets >/dev/null
    # Go's v0.20.2 misses a lease made in the first instants of its watch: one node after the
    # other, the second when the first has watched a while.
    start_daemon "$impl" $nsa 1
    sleep 2
    start_daemon "$impl" $nsb 2
    setup_pod $nsa $pa "$(env_value "$work/1.env" FLANNEL_SUBNET)" "$(env_value "$work/1.env" FLANNEL_MTU)"
    setup_pod $nsb $pb "$(env_value "$work/2.env" FLANNEL_SUBNET)" "$(env_value "$work/2.env" FLANNEL_MTU)"
}

tear_down() {
    local ns p
    stop_daemons
    for ns in $nsa $nsb; do
        # ours leaves its tunnel running when flanneld stops, for the pods' sake
        for p in $(pids_in $ns flannel-udp); do
            kill "$p"
            for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
        done
        ip -n $ns link del flannel0 2>/dev/null || true
        ip -n $ns link del flannel.1 2>/dev/null || true
    done
    ip netns del $pa 2>/dev/null || true
    ip netns del $pb 2>/dev/null || true
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-8s %5s %8s %10s %10s %10s %6s\n' impl round Gbit/s "CPU s/Gbit" iperf3 machine MTU
for round in $(seq "$rounds"); do
    for impl in $impls; do
        bring_up "$impl"
        dest=$pod_ip
        carriers=""
        case $impl in
            ours) carriers="$(pids_in $nsa flannel-udp) $(pids_in $nsb flannel-udp) ${daemons[*]}" ;;
            go) carriers="${daemons[*]}" ;;
        esac
        ok=""
        for _ in $(seq 60); do
            ip netns exec $pa ping -c 1 -W 1 "$dest" >/dev/null 2>&1 && { ok=1; break; }
        done
        if [ -z "$ok" ]; then
            echo "$impl: pod a does not reach pod b ($dest) within 60 s" >&2
            for n in 1 2; do [ ! -f "$work/$impl-$n.log" ] || { echo "node $n's log:"; tail -15 "$work/$impl-$n.log"; } >&2; done
            exit 1
        fi
        printf '%-8s %5s ' "$impl" "$round"
        # shellcheck disable=SC2086
        line=$(scripts/iperf_cpu.py $pa $pb "$dest" "$secs" $carriers)
        printf '%s %6s\n' "$line" "$(ip -n $pa -o link show eth0 | sed -n 's/.* mtu \([0-9]*\).*/\1/p')"
        tear_down
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
