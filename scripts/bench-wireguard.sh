#!/usr/bin/env bash
# WireGuard tunnel throughput, side by side in one run: our userspace tunnel (flannel-wireguard,
# release build), the `wireguard-go` first on PATH, and the kernel's vxlan (flannel's vxlan
# backend's data path, the ceiling of what the namespaces carry). Two "nodes" (namespaces) on a
# veth, a "pod" namespace routed behind each; the tunnels configured with `wg` as flanneld
# configures a node (address /32, a route for the other pod's subnet, one peer), MTU 1420 as
# flanneld gives it (vxlan: 1450). Rounds interleave the tunnels, so load from elsewhere falls
# on all of them alike.
#   scripts/bench-wireguard.sh [seconds (default 10)] [rounds (default 3)]
# For each round and tunnel: iperf3 TCP throughput pod to pod; the tunnel processes' CPU seconds
# per Gbit carried; the share of the machine (all cores) iperf3 itself took, client and server;
# the share of the machine busy in all (this includes whatever else the machine runs).
# Then, for the userspace tunnels, the time `wg setconf` takes to program PEERS (default 5000)
# peers into a fresh device and the process's RSS after it; and what a restart costs pods, for
# ours: pings at 100/s while (a) the configuration is applied again to the running tunnel (what
# a restarted flanneld does to the tunnel it left), (b) the tunnel process itself is restarted.
# IMPLS="ours wireguard-go vxlan" picks the tunnels; OURS=<binary> another build of ours. `wireguard-go` is Debian's unless another is
# first on PATH: for the reference anchor, mkdir -p /tmp/wgref && ln -s
# "$PWD/../shared/reference/wireguard-go-f67c862" /tmp/wgref/wireguard-go && PATH=/tmp/wgref:$PATH.
# Needs root; it makes only namespaces (and removes them), never touches the root namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark creates network namespaces" >&2; exit 1; }
for t in wireguard-go wg iperf3 python3 ping; do
    command -v $t >/dev/null || { echo "missing $t: apt-get install wireguard-go wireguard-tools iperf3 python3 iputils-ping" >&2; exit 1; }
done
secs=${1:-10}
rounds=${2:-3}
impls=${IMPLS:-ours wireguard-go vxlan}
# OURS=<binary> measures another build of ours (one kept from an earlier commit, say).
if [ -z "${OURS:-}" ]; then
    cargo build --release --locked --quiet -p flannel-wireguard
fi
ours=${OURS:-$PWD/target/release/flannel-wireguard}

tag=wgb$$
nsa=$tag-a nsb=$tag-b pa=$tag-pa pb=$tag-pb
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for n in $nsa $nsb $pa $pb; do ip netns del "$n" 2>/dev/null || true; done
    rm -f /var/run/wireguard/$tag-*.sock "$tag".ping
}
trap cleanup EXIT

# node namespace, pod namespace, node number
setup_pod() {
    local ns=$1 pod=$2 n=$3
    ip netns add "$pod"
    ip -n "$ns" link add "$tag-p$n" type veth peer name eth0 netns "$pod"
    ip -n "$ns" addr add 10.77.$n.1/24 dev "$tag-p$n"
    ip -n "$ns" link set "$tag-p$n" up
    ip -n "$pod" addr add 10.77.$n.2/24 dev eth0
    ip -n "$pod" link set eth0 up
    ip -n "$pod" link set lo up
    ip -n "$pod" route add default via 10.77.$n.1
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
}

ip netns add $nsa
ip netns add $nsb
ip -n $nsa link add ul type veth peer name ul netns $nsb
ip -n $nsa addr add 192.168.77.1/24 dev ul
ip -n $nsb addr add 192.168.77.2/24 dev ul
for n in $nsa $nsb; do ip -n $n link set ul up; ip -n $n link set lo up; done
setup_pod $nsa $pa 1
setup_pod $nsb $pb 2
keya=$(wg genkey) keyb=$(wg genkey)
puba=$(echo "$keya" | wg pubkey) pubb=$(echo "$keyb" | wg pubkey)

# tunnel implementation, node namespace, device, key, peer key, peer address, own and peer node number
start_tunnel() {
    local impl=$1 ns=$2 dev=$3 key=$4 peer=$5 peerip=$6 n=$7 m=$8
    case $impl in
        ours) ip netns exec "$ns" "$ours" "$dev" >/dev/null 2>&1 & ;;
        wireguard-go) WG_PROCESS_FOREGROUND=1 ip netns exec "$ns" wireguard-go -f "$dev" >/dev/null 2>&1 & ;;
        vxlan)
            ip -n "$ns" link add "$dev" type vxlan id 42 local 192.168.77.$n remote "$peerip" dstport 4789 dev ul
            ip -n "$ns" addr add 10.78.0.$n/24 dev "$dev"
            ip -n "$ns" link set "$dev" mtu 1450 up
            ip -n "$ns" route add 10.77.$m.0/24 via 10.78.0.$m dev "$dev"
            return ;;
    esac
    pids+=($!)
    for _ in $(seq 200); do [ -S /var/run/wireguard/$dev.sock ] && wg show "$dev" >/dev/null 2>&1 && break; sleep 0.05; done
    wg set "$dev" private-key <(echo "$key") listen-port 51820 \
        peer "$peer" endpoint "$peerip:51820" allowed-ips 10.77.$m.0/24
    ip -n "$ns" addr add 10.77.$n.0/32 dev "$dev"
    ip -n "$ns" link set "$dev" mtu 1420 up
    ip -n "$ns" route add 10.77.$m.0/24 dev "$dev" scope link
}

stop_tunnels() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    pids=()
    ip -n $nsa link del "$1" 2>/dev/null || true
    ip -n $nsb link del "$2" 2>/dev/null || true
}

# One iperf3 run from pod a to pod b: Gbit/s, the tunnel processes' CPU s per Gbit, iperf3's
# and the whole machine's busy share of all cores (scripts/iperf_cpu.py, as bench-udp.sh).
measure() {
    scripts/iperf_cpu.py "$pa" "$pb" 10.77.2.2 "$secs" "${pids[@]}"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
printf '%-14s %5s %8s %10s %10s %10s\n' tunnel round Gbit/s "CPU s/Gbit" "iperf3" "machine"
for round in $(seq "$rounds"); do
    for impl in $impls; do
        da=$tag-a$round db=$tag-b$round
        start_tunnel $impl $nsa $da "$keya" "$pubb" 192.168.77.2 1 2 >/dev/null
        start_tunnel $impl $nsb $db "$keyb" "$puba" 192.168.77.1 2 1 >/dev/null
        ip netns exec $pa ping -c 3 -i 0.2 -W 2 10.77.2.2 >/dev/null || { echo "$impl: no ping across the tunnel" >&2; exit 1; }
        printf '%-14s %5s ' "$impl" "$round"
        measure
        stop_tunnels $da $db
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

userspace=""
for impl in $impls; do [ "$impl" = vxlan ] || userspace="$userspace $impl"; done
npeers=${PEERS:-5000}
conf=$(mktemp)
python3 - "$npeers" "$(wg genkey)" >"$conf" <<'PY'
import base64, os, sys
n, key = int(sys.argv[1]), sys.argv[2]
print(f"[Interface]\nPrivateKey = {key}\nListenPort = 51820")
for i in range(n):
    pub = base64.b64encode(os.urandom(32)).decode()
    print(f"[Peer]\nPublicKey = {pub}\nEndpoint = 192.168.{100 + i // 250}.{1 + i % 250}:51820")
    print(f"AllowedIPs = 10.{64 + i // 256}.{i % 256}.0/24")
PY
echo
printf '%-14s %7s %14s %10s\n' tunnel peers "setconf ms" "RSS MiB"
for impl in $userspace; do
    dev=$tag-c
    case $impl in
        ours) ip netns exec $nsa "$ours" "$dev" >/dev/null 2>&1 & ;;
        wireguard-go) WG_PROCESS_FOREGROUND=1 ip netns exec $nsa wireguard-go -f "$dev" >/dev/null 2>&1 & ;;
    esac
    pid=$!
    pids+=($pid)
    for _ in $(seq 200); do wg show "$dev" >/dev/null 2>&1 && break; sleep 0.05; done
    start=$(date +%s%N)
    wg setconf "$dev" "$conf"
    end=$(date +%s%N)
    got=$(wg show "$dev" peers | wc -l)
    [ "$got" = "$npeers" ] || { echo "$impl: $got peers programmed of $npeers" >&2; exit 1; }
    rss=$(awk '/^VmRSS/ {print $2}' /proc/$pid/status)
    printf '%-14s %7d %14.1f %10.1f\n' "$impl" "$npeers" "$(echo "($end - $start) / 1000000" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
    stop_tunnels $dev $dev
done
rm -f "$conf"

# pings lost, of 400 at 100/s, while "$@" runs 1 s in
lost_during() {
    ip netns exec $pa ping -q -c 400 -i 0.01 -W 1 10.77.2.2 >"$tag.ping" 2>&1 &
    local ping=$!
    sleep 1
    local t0 t1
    t0=$(date +%s%N)
    "$@"
    t1=$(date +%s%N)
    wait $ping || true
    local got
    got=$(sed -n 's/.* \([0-9]*\) received.*/\1/p' "$tag.ping")
    rm -f "$tag.ping"
    printf '%-44s %6d %10.0f\n' "$1" $((400 - got)) "$(echo "($t1 - $t0) / 1000000" | bc -l)"
}
reapply() { wg set $tag-ra private-key <(echo "$keya") listen-port 51820 peer "$pubb" endpoint 192.168.77.2:51820 allowed-ips 10.77.2.0/24; }
restart_tunnel() {
    kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
    start_tunnel ours $nsa $tag-ra "$keya" "$pubb" 192.168.77.2 1 2
    pids=("${pids[@]:1}")
}
if [[ " $impls " == *" ours "* ]]; then
    echo
    printf '%-44s %6s %10s\n' "ours, during" lost "took ms"
    start_tunnel ours $nsa $tag-ra "$keya" "$pubb" 192.168.77.2 1 2
    start_tunnel ours $nsb $tag-rb "$keyb" "$puba" 192.168.77.1 2 1
    ip netns exec $pa ping -c 3 -i 0.2 -W 2 10.77.2.2 >/dev/null
    lost_during reapply
    lost_during restart_tunnel
    stop_tunnels $tag-ra $tag-rb
fi
