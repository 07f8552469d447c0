#!/usr/bin/env bash
# WireGuard tunnel throughput, side by side in one run: our userspace tunnel (flannel-wireguard)
# against Debian's wireguard-go, each between two namespaces ("nodes") joined by a veth, the
# tunnel configured with `wg` as flanneld configures a node (address /32, scope-link route,
# one peer per node), MTU 1440. For each: TCP throughput of iperf3 from a pod namespace behind
# one node to a pod behind the other, and the tunnel processes' CPU seconds per Gbit carried.
#   scripts/bench-wireguard.sh [seconds (default 10)] [rounds (default 3)]
# Then, for each, the time `wg setconf` takes to program PEERS (default 5000) peers into a fresh
# device (one per node of a cluster of that size: key, endpoint, a /24) and the tunnel
# process's RSS after it.
# Last, what a restart costs pods, for our tunnel: pings at 100/s between the pods while (a) the
# configuration is applied again to the running tunnel (what a restarted flanneld does to a
# tunnel process that outlived it), and (b) the tunnel process itself is restarted and configured
# again (what restarting flanneld would cost were the tunnel inside it).
# IMPLS="ours wireguard-go" picks the tunnels. Needs root; quote only from a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark creates network namespaces" >&2; exit 1; }
for t in wireguard-go wg iperf3; do
    command -v $t >/dev/null || { echo "missing $t: apt-get install wireguard-go wireguard-tools iperf3" >&2; exit 1; }
done
secs=${1:-10}
rounds=${2:-3}
impls=${IMPLS:-ours wireguard-go}
cargo build --release --locked --quiet -p flannel-wireguard
ours=$PWD/target/release/flannel-wireguard

tag=wgb$$
nsa=$tag-a nsb=$tag-b pa=$tag-pa pb=$tag-pb
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for n in $nsa $nsb $pa $pb; do ip netns del "$n" 2>/dev/null || true; done
    rm -f /var/run/wireguard/$tag-*.sock
}
trap cleanup EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# node namespace, pod namespace, underlay address, node number
setup_node() {
    local ns=$1 pod=$2 n=$4
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
ip -n $nsa link set ul up
ip -n $nsb link set ul up
ip -n $nsa link set lo up
ip -n $nsb link set lo up
setup_node $nsa $pa 192.168.77.1 1
setup_node $nsb $pb 192.168.77.2 2
keya=$(wg genkey) keyb=$(wg genkey)
puba=$(echo "$keya" | wg pubkey) pubb=$(echo "$keyb" | wg pubkey)

# tunnel implementation, node namespace, device, key, peer key, peer address, own and peer node number
start_tunnel() {
    local impl=$1 ns=$2 dev=$3 key=$4 peer=$5 peerip=$6 n=$7 m=$8
    case $impl in
        ours) ip netns exec "$ns" "$ours" "$dev" >/dev/null 2>&1 & ;;
        wireguard-go) WG_PROCESS_FOREGROUND=1 ip netns exec "$ns" wireguard-go -f "$dev" >/dev/null 2>&1 & ;;
    esac
    pids+=($!)
    for _ in $(seq 100); do [ -S /var/run/wireguard/$dev.sock ] && wg show "$dev" >/dev/null 2>&1 && break; sleep 0.05; done
    wg set "$dev" private-key <(echo "$key") listen-port 51820 \
        peer "$peer" endpoint "$peerip:51820" allowed-ips 10.77.$m.0/24
    ip -n "$ns" addr add 10.77.$n.0/32 dev "$dev"
    ip -n "$ns" link set "$dev" mtu 1440 up
    ip -n "$ns" route add 10.77.$m.0/24 dev "$dev" scope link
}

stop_tunnels() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    pids=()
    ip -n $nsa link del "$1" 2>/dev/null || true
    ip -n $nsb link del "$2" 2>/dev/null || true
}

printf '%-14s %5s %10s %16s\n' tunnel round Gbit/s "CPU s per Gbit"
for round in $(seq "$rounds"); do
    for impl in $impls; do
        da=$tag-a$round db=$tag-b$round
        start_tunnel $impl $nsa $da "$keya" "$pubb" 192.168.77.2 1 2 >/dev/null
        start_tunnel $impl $nsb $db "$keyb" "$puba" 192.168.77.1 2 1 >/dev/null
        ip netns exec $pa ping -c 3 -i 0.2 -W 2 10.77.2.2 >/dev/null || { echo "$impl: no ping across the tunnel" >&2; exit 1; }
        ip netns exec $pb iperf3 -s -D -1 -B 10.77.2.2 >/dev/null 2>&1
        sleep 0.3
        before=0; for p in "${pids[@]}"; do before=$((before + $(cpu_ticks "$p"))); done
        out=$(ip netns exec $pa iperf3 -c 10.77.2.2 -t "$secs" -J)
        after=0; for p in "${pids[@]}"; do after=$((after + $(cpu_ticks "$p"))); done
        bps=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])')
        hz=$(getconf CLK_TCK)
        python3 - "$impl" "$round" "$bps" "$before" "$after" "$hz" "$secs" <<'PY'
import sys
impl, rnd, bps, before, after, hz, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
gbit = bps * secs / 1e9
cpu = (after - before) / hz
print(f"{impl:<14} {rnd:>5} {bps/1e9:10.3f} {cpu/gbit:16.3f}")
PY
        stop_tunnels $da $db
    done
done

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
for impl in $impls; do
    dev=$tag-c
    case $impl in
        ours) ip netns exec $nsa "$ours" "$dev" >/dev/null 2>&1 & ;;
        wireguard-go) ip netns exec $nsa wireguard-go -f "$dev" >/dev/null 2>&1 & ;;
    esac
    pid=$!
    pids+=($pid)
    for _ in $(seq 100); do wg show "$dev" >/dev/null 2>&1 && break; sleep 0.05; done
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
