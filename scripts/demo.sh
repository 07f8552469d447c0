#!/usr/bin/env bash
# The suite's main job: a three-node flannel cluster on this one machine. It builds, installs
# into a temporary prefix, joins three node namespaces to an "underlay" namespace's bridge, runs
# flanneld on each (embedded registry, with --etcd a real etcd started in the underlay, or with
# --kube leases from Node objects in the Kubernetes API server stand-in started there),
# makes two pods per node through the plugins of the stock 10-flannel.conflist, has every pod
# ping every other and talk TCP across nodes, prints what each node holds, and tears it all
# down (--keep leaves it up and prints the command that removes it). With --backend wireguard
# each node's flanneld runs in a mount namespace of its own (its /run/wireguard, as on a machine
# of its own), the tunnel is WireGuard's (the userspace one on a kernel without WireGuard) and
# `wg show` is printed per node. With --kube --netpol flannel-netpol runs on each node, and a
# NetworkPolicy lets one pod reach the web server and turns another away. With --dual-stack the
# underlay, the network and every pod have IPv6 beside IPv4, and each family gets its own ping
# table and TCP check. Everything happens in namespaces this script creates; the root namespace
# is never touched.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--etcd | --kube [--netpol]] [--backend vxlan|host-gw|wireguard] [--dual-stack] [--keep] [--no-build | --debug]
  --etcd        leases in a real etcd started in the underlay namespace (default: the embedded registry)
  --kube        leases from Node objects (--kube-subnet-mgr) in the API server stand-in in the underlay
  --netpol      with --kube: flannel-netpol on every node, a policy that allows one pod and denies another
  --backend B   the network's backend (default vxlan)
  --dual-stack  IPv6 beside IPv4: on the underlay, in the network config, in every pod
  --keep        leave the cluster up and print the command that tears it down
  --no-build    install the release binaries target/ already holds
  --debug       build and install debug binaries (quicker to build than release)
USAGE
}

use_etcd=0
use_kube=0
use_netpol=0
backend=vxlan
dual=0
keep=0
build=release
while [ $# -gt 0 ]; do
    case "$1" in
        --etcd) use_etcd=1; shift ;;
        --kube) use_kube=1; shift ;;
        --netpol) use_netpol=1; shift ;;
        --backend) backend=${2:?--backend needs vxlan, host-gw or wireguard}; shift 2 ;;
        --dual-stack) dual=1; shift ;;
        --keep) keep=1; shift ;;
        --no-build) build=none; shift ;;
        --debug) build=debug; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$backend" in vxlan|host-gw|wireguard) ;; *) echo "--backend: vxlan, host-gw or wireguard, not $backend" >&2; exit 2 ;; esac
[ "$use_etcd$use_kube" = 11 ] && { echo "--etcd and --kube: one registry at a time" >&2; exit 2; }
[ "$use_netpol" = 1 ] && [ "$use_kube" = 0 ] && { echo "--netpol needs --kube: the policies live in the API" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "the demo creates network namespaces: run as root" >&2; exit 1; }

top=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(mktemp -d /tmp/cni-demo.XXXXXX)
id=$$
net=192.168.50
underlay=demo-underlay-$id
network=10.244.0.0/16
# --dual-stack: the underlay's IPv6 prefix (node n is $net6::n, the underlay $net6::fe) and the
# cluster's IPv6 network.
net6=fd00:50:
network6=fd10:244::/48
nodes=(1 2 3)
pods_per_node=(1 2)
namespaces=()
pids=()
step_no=0
steps=11
[ "$use_netpol" = 1 ] && steps=12

step() { step_no=$((step_no + 1)); printf '\n\033[1m[%d/%d] %s\033[0m\n' "$step_no" "$steps" "$*"; }
show() { printf '$ %s\n' "$*"; "$@" 2>&1 | sed 's/^/    /'; }
fail() { printf '\n\033[1;31mFAILED: %s\033[0m\n' "$*" >&2; exit 1; }
node_ns() { echo "demo-node$1-$id"; }
pod_ns() { echo "demo-n$1p$2-$id"; }
# Background processes are started with nsenter directly (it execs), so that $! is their pid.
in_node() { local n=$1; shift; nsenter --net="/run/netns/$(node_ns "$n")" "$@"; }
in_underlay() { nsenter --net="/run/netns/$underlay" "$@"; }
add_ns() { ip netns add "$1"; namespaces+=("$1"); ip -n "$1" link set lo up; }

# The teardown, written out so that --keep can hand it to the user: processes first (only
# those whose command line names this demo's prefix, in case a pid was reused since), then
# the namespaces, then the prefix.
write_teardown() {
    {
        echo '#!/usr/bin/env bash'
        echo "# Removes the demo cluster started by $0 (prefix $prefix)."
        echo "for p in ${pids[*]:-}; do"
        echo "    grep -qs -- '$prefix' /proc/\$p/cmdline && kill \$p"
        echo 'done'
        echo "for p in ${pids[*]:-}; do"
        echo "    for _ in \$(seq 50); do grep -qs -- '$prefix' /proc/\$p/cmdline || break; sleep 0.1; done"
        echo 'done'
        # What the nodes' flanneld started and left running (the wireguard backend's tunnels).
        echo "for ns in ${namespaces[*]:-}; do"
        echo "    for p in \$(ip netns pids \$ns 2>/dev/null); do grep -qs -- '$prefix' /proc/\$p/cmdline && kill \$p; done"
        echo 'done'
        echo "for ns in ${namespaces[*]:-}; do ip netns del \$ns 2>/dev/null; done"
        echo "rm -rf '$prefix'"
    } >"$prefix/teardown.sh"
    chmod +x "$prefix/teardown.sh"
}

finish() {
    local status=$?
    set +e
    write_teardown
    if [ "$keep" = 1 ]; then
        printf '\nThe cluster is left up (%s). Nodes: %s; underlay: %s.\n' \
            "$([ $status = 0 ] && echo complete || echo after a failure)" \
            "$(for n in "${nodes[@]}"; do printf '%s ' "$(node_ns "$n")"; done)" "$underlay"
        printf 'Enter a node: nsenter --net=/run/netns/%s bash\n' "$(node_ns 1)"
        printf 'Tear it down: %s/teardown.sh\n' "$prefix"
    else
        "$prefix/teardown.sh"
    fi
    exit $status
}
trap finish EXIT

# Runs one plugin exactly as a runtime does: CNI_* in the environment, the config on stdin,
# inside node $1's namespace. Prints the plugin's stdout; fails the step naming node and pod.
cni() {
    local node=$1 command=$2 plugin=$3 container=$4 netns=$5 ifname=$6 config=$7 out
    if ! out=$(CNI_COMMAND=$command CNI_CONTAINERID=$container CNI_NETNS=$netns CNI_IFNAME=$ifname \
        CNI_PATH=$prefix/bin in_node "$node" "$prefix/bin/$plugin" <<<"$config"); then
        fail "node $node: $plugin $command for $container: $out"
    fi
    printf '%s' "$out"
}

# The plugins of the stock conflist (testdata/10-flannel.conflist) as libcni hands them over:
# each gets the list's name and cniVersion; the file locations point into the node's directory.
flannel_conf() {
    local n=$1
    echo "{\"cniVersion\":\"0.3.1\",\"name\":\"cbr0\",\"type\":\"flannel\",
      \"subnetFile\":\"$prefix/node$n/subnet.env\",\"dataDir\":\"$prefix/node$n/flannel\",
      \"ipam\":{\"dataDir\":\"$prefix/node$n/networks\"},
      \"delegate\":{\"hairpinMode\":true,\"isDefaultGateway\":true}}"
}
loopback_conf='{"cniVersion":"0.3.1","name":"cbr0","type":"loopback"}'
mappings_of() { if [ "$1$2" = 11 ]; then echo '[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]'; else echo '[]'; fi; }
portmap_conf() {
    echo "{\"cniVersion\":\"0.3.1\",\"name\":\"cbr0\",\"type\":\"portmap\",
      \"capabilities\":{\"portMappings\":true},\"runtimeConfig\":{\"portMappings\":$1}${2:+,\"prevResult\":$2}}"
}

# subnet.env's value of $2 on node $1.
env_of() { sed -n "s/^$2=//p" "$prefix/node$1/subnet.env"; }
# Node $1's IPv4 subnet key (10.244.5.0-24), from its FLANNEL_SUBNET.
subnet_of() { env_of "$1" FLANNEL_SUBNET | sed 's/\.[0-9]*\/\([0-9]*\)$/.0-\1/'; }
# Node $1's IPv6 subnet key (fd10:244:0:5::-64), from its FLANNEL_IPV6_SUBNET.
subnet6_of() { env_of "$1" FLANNEL_IPV6_SUBNET | sed 's/::1\/\([0-9]*\)$/::-\1/'; }
# The lease key: 10.244.5.0-24, or 10.244.5.0-24&fd10:244:0:5::-64 with both families.
lease_of() { if [ "$dual" = 1 ]; then echo "$(subnet_of "$1")&$(subnet6_of "$1")"; else subnet_of "$1"; fi; }
pod_ip() { ip -n "$(pod_ns "$1" "$2")" -4 -o addr show eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1; }
pod_ip6() { ip -n "$(pod_ns "$1" "$2")" -6 -o addr show eth0 scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1; }

step "packages: $top/scripts/deps.sh demo"
"$top/scripts/deps.sh" demo
if [ "$use_etcd" = 1 ] && ! { command -v etcd && command -v etcdctl; } >/dev/null; then
    echo "installing etcd-server and etcd-client for --etcd"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null
fi
if [ "$use_kube" = 1 ] && ! command -v kubectl >/dev/null; then
    echo "installing kubernetes-client (kubectl) for --kube"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client >/dev/null
fi

# flanneld beside the plugins; its unit and env file stay inside $prefix too.
install_args=(--bin-dir "$prefix/bin" --conf-dir "$prefix/net.d" --with-conf --daemon
    --daemon-bin-dir "$prefix/bin" --systemd-dir "$prefix/systemd" --env-file "$prefix/flanneld.env")
case "$build" in
    release) step "build (release) and install into $prefix"
        "$top/scripts/install.sh" "${install_args[@]}" ;;
    none) step "install the release binaries already built into $prefix"
        "$top/scripts/install.sh" "${install_args[@]}" --no-build ;;
    debug) step "build (debug) and install into $prefix"
        (cd "$top" && cargo build --workspace --bins --quiet)
        mkdir -p "$prefix/bin" "$prefix/net.d"
        for b in flannel bridge host-local portmap loopback flanneld flannel-wireguard flannel-netpol; do
            install -m 0755 "${CARGO_TARGET_DIR:-$top/target}/debug/$b" "$prefix/bin/$b"
        done
        install -m 0644 "$top"/testdata/*.conflist "$prefix/net.d/" ;;
esac
show cat "$prefix/net.d/10-flannel.conflist"
if [ "$use_kube" = 1 ]; then
    # The API server stand-in of the tests (testkit): with the debug build, made by it; else
    # built as install.sh builds the release binaries (static, in the host triple's directory),
    # which --no-build does only when it finds none there or in target/release.
    target_dir=${CARGO_TARGET_DIR:-$top/target}
    host_triple=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
    standin=$target_dir/${host_triple:+$host_triple/}release/kube-apiserver-standin
    case "$build" in
        debug) standin=$target_dir/debug/kube-apiserver-standin ;;
        none) [ -x "$standin" ] || [ ! -x "$target_dir/release/kube-apiserver-standin" ] ||
            standin=$target_dir/release/kube-apiserver-standin ;;
    esac
    if [ "$build" = release ] || [ ! -x "$standin" ]; then
        command -v cargo >/dev/null ||
            fail "missing $standin, and no cargo to build it: run without --no-build where cargo is"
        [ "$build" = release ] || echo "    $standin is missing: building it"
        (cd "$top" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
            cargo build --release --locked --quiet --target "$host_triple" --bin kube-apiserver-standin)
        standin=$target_dir/$host_triple/release/kube-apiserver-standin
    fi
    install -m 0755 "$standin" "$prefix/bin/"
fi

step "the underlay: namespace $underlay with bridge br0 at $net.254/24"
add_ns "$underlay"
in_underlay ip link add br0 type bridge
in_underlay ip addr add "$net.254/24" dev br0
[ "$dual" = 1 ] && in_underlay ip addr add "${net6}:fe/64" dev br0 nodad
in_underlay ip link set br0 up

step "three nodes, each a namespace whose eth0 is plugged into the underlay's bridge"
for n in "${nodes[@]}"; do
    ns=$(node_ns "$n")
    add_ns "$ns"
    mkdir -p "$prefix/node$n"
    in_underlay ip link add "n$n" type veth peer name eth0 netns "/run/netns/$ns" ||
        fail "node $n: plugging eth0 into the underlay"
    in_underlay ip link set "n$n" master br0 up
    in_node "$n" ip addr add "$net.$n/24" dev eth0
    in_node "$n" ip link set eth0 up
    in_node "$n" ip route add default via "$net.254" dev eth0
    in_node "$n" sysctl -qw net.ipv4.ip_forward=1
    printf '    node %s: %s, eth0 %s.%s/24, default via %s.254\n' "$n" "$ns" "$net" "$n" "$net"
    if [ "$dual" = 1 ]; then
        # flanneld needs an IPv6 address on the external interface for the IPv6 half.
        in_node "$n" ip addr add "${net6}:$n/64" dev eth0 nodad
        in_node "$n" ip -6 route add default via "${net6}:fe" dev eth0
        in_node "$n" sysctl -qw net.ipv6.conf.all.forwarding=1
        printf '    node %s: eth0 also %s:%s/64, default via %s:fe\n' "$n" "$net6" "$n" "$net6"
    fi
done

config="{\"Network\":\"$network\",\"Backend\":{\"Type\":\"$backend\"}}"
[ "$dual" = 1 ] && config="{\"Network\":\"$network\",\"EnableIPv6\":true,\"IPv6Network\":\"$network6\",\"Backend\":{\"Type\":\"$backend\"}}"
# The blocks named in $1 (keys two spaces in) of the YAML on stdin, as kubectl prints them.
yaml_blocks() {
    awk -v want=" $1 " '/^[a-zA-Z]/ { show = 0 }
        match($0, /^  [a-zA-Z]+:/) { show = index(want, " " substr($0, 3, RLENGTH - 3) " ") > 0 }
        show'
}
# Node n's Node object: its podCIDRs, as the controller manager's node IPAM gives them.
node_object() {
    local n=$1 cidrs="\"${network%.0.0/16}.$n.0/24\""
    [ "$dual" = 1 ] && cidrs="$cidrs,\"${network6%::/48}:0:$n::/64\""
    echo "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"node$n\"},\"spec\":{\"podCIDRs\":[$cidrs]}}"
}
node_env=()
if [ "$use_kube" = 1 ]; then
    api="https://$net.254:6443"
    step "the registry: the Kubernetes API server stand-in in the underlay at $api, a Node per node"
    sa=system:serviceaccount:flannel-cni-rs:flanneld
    netpol_sa=system:serviceaccount:flannel-cni-rs:flannel-netpol
    nsenter --net="/run/netns/$underlay" "$prefix/bin/kube-apiserver-standin" --dir "$prefix/kube" \
        --listen "$net.254:6443" --user "$sa" --netpol-user "$netpol_sa" >"$prefix/kube.log" 2>&1 &
    pids+=($!)
    admin=$prefix/kube/kubernetes-admin.kubeconfig
    for _ in $(seq 100); do grep -q '^serving' "$prefix/kube.log" 2>/dev/null && break; sleep 0.1; done
    grep -q '^serving' "$prefix/kube.log" || { cat "$prefix/kube.log" >&2; fail "underlay: the API server stand-in did not start"; }
    kubectl() { in_underlay env HOME="$prefix/kube" KUBECONFIG="$admin" kubectl "$@"; }
    for n in "${nodes[@]}"; do
        node_object "$n" >"$prefix/kube/node$n.json"
        kubectl create --validate=false -f "$prefix/kube/node$n.json" >/dev/null || fail "creating Node node$n"
    done
    show kubectl get nodes -o custom-columns=NAME:.metadata.name,PODCIDRS:.spec.podCIDRs
    echo "$config" >"$prefix/net-conf.json"
    show cat "$prefix/net-conf.json"
    # Every flanneld uses one service account, allowed what kube-flannel's ClusterRole allows.
    registry_args=(--kube-subnet-mgr --kubeconfig-file "$prefix/kube/${sa//:/_}.kubeconfig"
        --net-config-path "$prefix/net-conf.json")
elif [ "$use_etcd" = 1 ]; then
    etcd_url="http://$net.254:2379"
    step "the registry: etcd in the underlay at $etcd_url, holding the network config"
    nsenter --net="/run/netns/$underlay" etcd --name demo --data-dir "$prefix/etcd" \
        --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster demo=http://127.0.0.1:2380 --log-level warn 2>"$prefix/etcd.log" &
    pids+=($!)
    etcdctl() { in_underlay env ETCDCTL_API=3 etcdctl --endpoints "$etcd_url" --command-timeout=5s "$@"; }
    for _ in $(seq 100); do etcdctl endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
    etcdctl endpoint health >/dev/null 2>&1 || { cat "$prefix/etcd.log" >&2; fail "underlay: etcd did not answer at $etcd_url within 20 s"; }
    etcdctl put /coreos.com/network/config -- "$config" >/dev/null
    show etcdctl get /coreos.com/network/config
    registry_args=(--etcd-endpoints "$etcd_url")
else
    step "the registry: the embedded one, a directory every node's flanneld shares"
    mkdir -p "$prefix/registry"
    echo "$config" >"$prefix/registry/config"
    show cat "$prefix/registry/config"
    registry_args=(--registry-dir "$prefix/registry")
fi

if [ "$backend" = wireguard ]; then
    # flanneld runs its userspace tunnel from beside itself (install.sh put it there); `wg` shows it.
    if ! command -v wg >/dev/null; then
        echo "installing wireguard-tools (wg) for --backend wireguard"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wireguard-tools >/dev/null
    fi
fi

# wireguard: each node's own /run/wireguard (its tunnels' sockets, where `wg` looks), in a mount
# namespace held by a sleeping process, and its own key file.
declare -A holders=()
in_machine() { local n=$1; shift; nsenter --mount="/proc/${holders[$n]}/ns/mnt" --net="/run/netns/$(node_ns "$n")" "$@"; }
step "flanneld on every node: a lease, subnet.env, then the $backend entries for the other nodes"
for n in "${nodes[@]}"; do
    node_env=()
    [ "$use_kube" = 1 ] && node_env=(NODE_NAME="node$n")
    mounts=()
    if [ "$backend" = wireguard ]; then
        mkdir -p /run/wireguard
        unshare -m --propagation private bash -c \
            'mount -t tmpfs wireguard /run/wireguard && exec -a "$0" sleep infinity' "$prefix/node$n/mounts" &
        holders[$n]=$!
        pids+=($!)
        for _ in $(seq 50); do grep -qs ' /run/wireguard ' "/proc/${holders[$n]}/mountinfo" && break; sleep 0.1; done
        mounts=(--mount="/proc/${holders[$n]}/ns/mnt")
        node_env+=(WIREGUARD_KEY_FILE="$prefix/node$n/wgkey")
    fi
    nsenter "${mounts[@]}" --net="/run/netns/$(node_ns "$n")" env "${node_env[@]}" "$prefix/bin/flanneld" "${registry_args[@]}" --iface eth0 \
        --subnet-file "$prefix/node$n/subnet.env" --ip-masq 2>"$prefix/node$n/flanneld.log" &
    pids+=($!)
done
for n in "${nodes[@]}"; do
    for _ in $(seq 150); do [ -s "$prefix/node$n/subnet.env" ] && break; sleep 0.1; done
    [ -s "$prefix/node$n/subnet.env" ] || { cat "$prefix/node$n/flanneld.log" >&2; fail "node $n: flanneld wrote no subnet.env within 15 s"; }
    printf '    node %s: lease %s, FLANNEL_MTU=%s\n' "$n" "$(lease_of "$n")" "$(env_of "$n" FLANNEL_MTU)"
done
if [ "$dual" = 1 ] && [ "$backend" = vxlan ]; then
    # vxlan over IPv6 carries 20 bytes more of headers: flannel-v6.1 gets 70 less than eth0 and
    # FLANNEL_MTU the smaller of the two devices' (flanneld takes 50 off both).
    mtu_of() { in_node 1 ip -o link show "$1" | sed -n 's/.* mtu \([0-9]*\).*/\1/p'; }
    printf '    node 1: eth0 mtu %s, flannel.1 mtu %s, flannel-v6.1 mtu %s\n' \
        "$(mtu_of eth0)" "$(mtu_of flannel.1)" "$(mtu_of flannel-v6.1)"
fi
if [ "$use_kube" = 1 ]; then
    for n in "${nodes[@]}"; do
        printf '$ kubectl get node node%s -o yaml   (its annotations and conditions)\n' "$n"
        kubectl get node "node$n" -o yaml | yaml_blocks "annotations conditions" | sed 's/^/    /'
    done
fi
# Every node has a route to every other node's subnet before any pod talks.
for n in "${nodes[@]}"; do
    for m in "${nodes[@]}"; do
        [ "$n" = "$m" ] && continue
        dsts=("$(subnet_of "$m" | tr - /)")
        [ "$dual" = 1 ] && dsts+=("$(subnet6_of "$m" | tr - /)")
        for dst in "${dsts[@]}"; do
            family=-4
            [[ $dst == *:* ]] && family=-6
            # wireguard: one route for the whole network; the subnet is a peer's allowed IPs.
            routed() {
                if [ "$backend" = wireguard ]; then in_machine "$n" wg show all allowed-ips | awk -v d="$dst" '{ for (i = 3; i <= NF; i++) if ($i == d) f = 1 } END { exit !f }'
                else [ -n "$(in_node "$n" ip "$family" route show "$dst")" ]; fi
            }
            for _ in $(seq 100); do routed && break; sleep 0.1; done
            routed || {
                tail -n 20 "$prefix/node$n/flanneld.log" >&2
                fail "node $n: no route to node $m's subnet $dst within 10 s"
            }
        done
    done
    printf '    node %s: routes to the other nodes: %s\n' "$n" \
        "$(in_node "$n" ip route show root "$network" | grep -v ' dev cni0' | awk '{print $1}' | paste -sd' ')"
    [ "$dual" = 1 ] && printf '    node %s: IPv6 routes to the other nodes: %s\n' "$n" \
        "$(in_node "$n" ip -6 route show root "$network6" | grep -v ' dev cni0' | awk '{print $1}' | paste -sd' ')"
done

step "two pods per node: loopback, flannel (-> bridge -> host-local) and portmap, as a runtime runs them"
for n in "${nodes[@]}"; do
    for k in "${pods_per_node[@]}"; do
        pod=$(pod_ns "$n" "$k")
        add_ns "$pod"
        cni "$n" ADD loopback "$pod" "/run/netns/$pod" lo "$loopback_conf" >/dev/null
        result=$(cni "$n" ADD flannel "$pod" "/run/netns/$pod" eth0 "$(flannel_conf "$n")")
        cni "$n" ADD portmap "$pod" "/run/netns/$pod" eth0 "$(portmap_conf "$(mappings_of "$n" "$k")" "$result")" >/dev/null
        mtu=$(ip -n "$pod" -o link show eth0 2>/dev/null | sed -n 's/.* mtu \([0-9]*\).*/\1/p')
        [ "$mtu" = "$(env_of "$n" FLANNEL_MTU)" ] || fail "node $n: pod $pod has MTU $mtu, FLANNEL_MTU is $(env_of "$n" FLANNEL_MTU)"
        printf '    node %s pod %s: %s, mtu %s (%s)\n' "$n" "$k" "$(pod_ip "$n" "$k") $(pod_ip6 "$n" "$k")" "$mtu" "$pod"
    done
done

# ping_table ADDR_OF: every pod pings every other pod's address (ADDR_OF node pod prints it)
# and prints a table; failures go into $failed.
ping_table() {
    local addr_of=$1 from to
    printf '    %-14s' "from \\ to"
    for to in "${all[@]}"; do printf '%-9s' "n${to%:*}p${to#*:}"; done
    echo
    for from in "${all[@]}"; do
        printf '    %-14s' "n${from%:*}p${from#*:}"
        for to in "${all[@]}"; do
            if [ "$from" = "$to" ]; then printf '%-9s' "-"; continue; fi
            local dst
            dst=$("$addr_of" "${to%:*}" "${to#*:}")
            # IPv6: the first pod's gateway on a fresh bridge may still be in duplicate address
            # detection for a second or so; one retry covers it.
            if ip netns exec "$(pod_ns "${from%:*}" "${from#*:}")" busybox ping -c 1 -W 2 "$dst" >/dev/null 2>&1 ||
                ip netns exec "$(pod_ns "${from%:*}" "${from#*:}")" busybox ping -c 1 -W 2 "$dst" >/dev/null 2>&1; then
                printf '%-9s' "ok"
            else
                printf '%-9s' "LOST"
                failed+=("node ${from%:*} pod ${from#*:} -> node ${to%:*} pod ${to#*:} ($dst)")
            fi
        done
        echo
    done
}

if [ "$dual" = 1 ]; then
    step "every pod pings every other pod, over IPv4 and over IPv6 (one echo each, 2 s to answer)"
else
    step "every pod pings every other pod (one echo each, 2 s to answer)"
fi
all=()
for n in "${nodes[@]}"; do for k in "${pods_per_node[@]}"; do all+=("$n:$k"); done; done
failed=()
[ "$dual" = 1 ] && echo "    IPv4:"
ping_table pod_ip
if [ "$dual" = 1 ]; then
    echo "    IPv6:"
    ping_table pod_ip6
fi
[ ${#failed[@]} = 0 ] || fail "$(printf '%s\n' "no answer:" "${failed[@]}")"

step "TCP: a web server in node 1's pod 1, reached from a pod on node 3 and through host port 8080 from node 2"
mkdir -p "$prefix/www" && echo "hello from node 1 pod 1" >"$prefix/www/index.html"
nsenter --net="/run/netns/$(pod_ns 1 1)" busybox httpd -f -p 80 -h "$prefix/www" &
pids+=($!)
web=$(pod_ip 1 1)
for _ in $(seq 30); do ip netns exec "$(pod_ns 1 1)" ss -Htln 'sport = :80' | grep -q . && break; sleep 0.1; done
printf '$ GET http://%s/ from node 3 pod 2\n' "$web"
page=$(printf 'GET / HTTP/1.0\r\n\r\n' | ip netns exec "$(pod_ns 3 2)" socat -t 3 - "TCP:$web:80,connect-timeout=3" | tail -n 1) ||
    fail "node 3: pod 2 could not connect to http://$web/ on node 1's pod 1"
[ -n "$page" ] || fail "node 3: pod 2 got no answer from http://$web/ on node 1's pod 1"
echo "    $page"
printf '$ GET http://%s.1:8080/ from node 2 (portmap on node 1 forwards it to the pod)\n' "$net"
page=$(printf 'GET / HTTP/1.0\r\n\r\n' | in_node 2 socat -t 3 - "TCP:$net.1:8080,connect-timeout=3" | tail -n 1) ||
    fail "node 2: no answer from host port 8080 on node 1"
[ -n "$page" ] || fail "node 2: host port 8080 on node 1 answered nothing"
echo "    $page"
if [ "$dual" = 1 ]; then
    web6=$(pod_ip6 1 1)
    printf '$ GET http://[%s]/ from node 3 pod 2\n' "$web6"
    page=$(printf 'GET / HTTP/1.0\r\n\r\n' | ip netns exec "$(pod_ns 3 2)" socat -t 3 - "TCP6:[$web6]:80,connect-timeout=3" | tail -n 1) ||
        fail "node 3: pod 2 could not connect to http://[$web6]/ on node 1's pod 1"
    [ -n "$page" ] || fail "node 3: pod 2 got no answer from http://[$web6]/ on node 1's pod 1"
    echo "    $page"
    printf '$ GET http://[%s:1]:8080/ from node 2 (portmap on node 1 forwards it to the pod)\n' "$net6"
    page=$(printf 'GET / HTTP/1.0\r\n\r\n' | in_node 2 socat -t 3 - "TCP6:[${net6}:1]:8080,connect-timeout=3" | tail -n 1) ||
        fail "node 2: no answer from host port 8080 on node 1's IPv6 address"
    [ -n "$page" ] || fail "node 2: host port 8080 on node 1's IPv6 address answered nothing"
    echo "    $page"
fi

if [ "$use_netpol" = 1 ]; then
    step "NetworkPolicy: flannel-netpol on every node; node 1's web server admits the pods labelled role=client"
    # The pods as the API knows them: namespace demo, node n pod k named n<n>p<k> on node<n>, its
    # addresses in its status as its kubelet writes them (a PATCH of pods/<name>/status, over
    # TLS with socat: kubectl 1.20, Debian's, has no --subresource).
    token=$(sed -n 's/^ *token: //p' "$admin")
    as_kubelet() {
        local path=$1 body=$2 reply
        # The request's end is held back a moment: the server answers and closes first, so
        # that no unread close_notify makes its close a reset.
        reply=$({ printf 'PATCH %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/merge-patch+json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' \
            "$path" "$net.254" "$token" "${#body}" "$body"; sleep 0.5; } |
            in_underlay socat -t 5 - "OPENSSL:$net.254:6443,cafile=$prefix/kube/ca.crt") || return 1
        printf '%s\n' "${reply%%$'\n'*}"
    }
    kubectl create namespace demo >/dev/null
    for n in "${nodes[@]}"; do
        for k in "${pods_per_node[@]}"; do
            labels="\"pod\":\"n${n}p${k}\""
            [ "$n:$k" = 1:1 ] && labels="$labels,\"app\":\"web\""
            [ "$n:$k" = 3:2 ] && labels="$labels,\"role\":\"client\""
            echo "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"n${n}p${k}\",\"namespace\":\"demo\",\"labels\":{$labels}},\"spec\":{\"nodeName\":\"node$n\",\"containers\":[{\"name\":\"c\",\"image\":\"demo\",\"ports\":[{\"name\":\"http\",\"containerPort\":80}]}]}}" >"$prefix/kube/pod-n${n}p${k}.json"
            kubectl create --validate=false -f "$prefix/kube/pod-n${n}p${k}.json" >/dev/null || fail "creating pod n${n}p${k}"
            ips="{\"ip\":\"$(pod_ip "$n" "$k")\"}"
            [ "$dual" = 1 ] && ips="$ips,{\"ip\":\"$(pod_ip6 "$n" "$k")\"}"
            answer=$(as_kubelet "/api/v1/namespaces/demo/pods/n${n}p${k}/status" \
                "{\"status\":{\"phase\":\"Running\",\"podIP\":\"$(pod_ip "$n" "$k")\",\"podIPs\":[$ips]}}")
            [[ $answer == *" 200 "* ]] || fail "pod n${n}p${k}: its status was not taken: $answer"
        done
    done
    show kubectl get pods -n demo -o custom-columns=NAME:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,LABELS:.metadata.labels
    for n in "${nodes[@]}"; do
        in_node "$n" "$prefix/bin/flannel-netpol" --kubeconfig "$prefix/kube/${netpol_sa//:/_}.kubeconfig" \
            --hostname-override "node$n" 2>"$prefix/node$n/flannel-netpol.log" &
        pids+=($!)
    done
    for n in "${nodes[@]}"; do
        for _ in $(seq 150); do grep -q 'table inet flannel-netpol:' "$prefix/node$n/flannel-netpol.log" && break; sleep 0.1; done
        grep -q 'table inet flannel-netpol:' "$prefix/node$n/flannel-netpol.log" ||
            { cat "$prefix/node$n/flannel-netpol.log" >&2; fail "node $n: flannel-netpol wrote no table within 15 s"; }
    done
    cat >"$prefix/kube/policy.yaml" <<POLICY
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-from-clients
  namespace: demo
spec:
  podSelector:
    matchLabels:
      app: web
  ingress:
  - from:
    - podSelector:
        matchLabels:
          role: client
    ports:
    - port: http
POLICY
    show cat "$prefix/kube/policy.yaml"
    kubectl create --validate=false -f "$prefix/kube/policy.yaml" >/dev/null || fail "creating the policy"
    for _ in $(seq 100); do grep -q 'isolated 1 for ingress' "$prefix/node1/flannel-netpol.log" && break; sleep 0.1; done
    grep -q 'isolated 1 for ingress' "$prefix/node1/flannel-netpol.log" ||
        { cat "$prefix/node1/flannel-netpol.log" >&2; fail "node 1: flannel-netpol did not isolate the web server within 10 s"; }
    get() { printf 'GET / HTTP/1.0\r\n\r\n' | ip netns exec "$(pod_ns "$1" "$2")" socat -t 2 - "TCP:$web:80,connect-timeout=2" 2>/dev/null | tail -n 1; }
    printf '$ GET http://%s/ from node 3 pod 2 (role=client)\n' "$web"
    page=$(get 3 2) || true
    [ -n "$page" ] || fail "node 3: pod 2 (role=client) was turned away by the policy that admits it"
    echo "    allowed: $page"
    printf '$ GET http://%s/ from node 2 pod 1 (no role)\n' "$web"
    page=$(get 2 1) || true
    [ -z "$page" ] || fail "node 2: pod 1 got through a policy that admits only role=client: $page"
    echo "    denied: no connection within 2 s"
    # Between two pods of one node the traffic is bridged: it meets the table only through
    # br_netfilter (flannel-netpol's doctor above says whether it does).
    if in_node 1 test -e /proc/sys/net/bridge/bridge-nf-call-iptables; then
        printf '$ GET http://%s/ from node 1 pod 2 (no role, same node)\n' "$web"
        page=$(get 1 2) || true
        [ -z "$page" ] || fail "node 1: pod 2 got through a policy that admits only role=client: $page"
        echo "    denied: no connection within 2 s"
    fi
    show in_node 1 "$prefix/bin/flannel-netpol" --kubeconfig "$prefix/kube/${netpol_sa//:/_}.kubeconfig" \
        --hostname-override node1 doctor
fi

step "what each node holds: its lease, routes, neighbours and FDB entries"
for n in "${nodes[@]}"; do
    key=$(lease_of "$n")
    printf '\n  node %s (%s, %s.%s)\n' "$n" "$(node_ns "$n")" "$net" "$n"
    if [ "$use_etcd" = 1 ]; then
        printf '    lease %s: %s\n' "$key" "$(etcdctl get --print-value-only "/coreos.com/network/subnets/$key")"
    elif [ "$use_kube" = 1 ]; then
        printf '    lease %s: Node node%s'"'"'s podCIDRs and annotations (shown above)\n' "$key" "$n"
    else
        printf '    lease %s: %s\n' "$key" "$(cat "$prefix/registry/subnets/$key")"
    fi
    show in_node "$n" ip route
    [ "$dual" = 1 ] && show in_node "$n" ip -6 route show root "$network6"
    if [ "$backend" = wireguard ]; then
        show in_machine "$n" wg show
    elif in_node "$n" ip link show flannel.1 >/dev/null 2>&1; then
        show in_node "$n" ip neigh show dev flannel.1
        show in_node "$n" bridge fdb show dev flannel.1
        if [ "$dual" = 1 ]; then
            show in_node "$n" ip neigh show dev flannel-v6.1
            show in_node "$n" bridge fdb show dev flannel-v6.1
        fi
    else
        printf '    (no flannel.1: %s routes via the other nodes'"'"' addresses, no neighbours or FDB entries of its own)\n' "$backend"
    fi
done

if [ "$keep" = 1 ]; then
    step "done: left up as asked (--keep)"
    exit 0
fi
step "tear down: each pod removed as the runtime does (portmap, flannel, loopback), then the nodes"
for n in "${nodes[@]}"; do
    for k in "${pods_per_node[@]}"; do
        pod=$(pod_ns "$n" "$k")
        cni "$n" DEL portmap "$pod" "/run/netns/$pod" eth0 "$(portmap_conf "$(mappings_of "$n" "$k")")" >/dev/null
        cni "$n" DEL flannel "$pod" "/run/netns/$pod" eth0 "$(flannel_conf "$n")" >/dev/null
        cni "$n" DEL loopback "$pod" "/run/netns/$pod" lo "$loopback_conf" >/dev/null
    done
    left=$(ls -A "$prefix/node$n/flannel" "$prefix/node$n/networks/cbr0" 2>/dev/null | grep -v -e '^$' -e ':$' -e '^lock$' -e '^last_reserved_ip' || true)
    [ -z "$left" ] || fail "node $n: DEL left files behind: $left"
    printf '    node %s: both pods deleted, no saved config or address left\n' "$n"
done
echo "    namespaces, processes and $prefix are removed on exit"
