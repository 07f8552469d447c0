#!/usr/bin/env bash
# The suite's main job, end to end on one throwaway node: build, install into a temporary
# prefix, start the fabric daemon for the node's subnet.env, then run the plugins as a runtime would for two pods on the stock flannel conflist,
# show what they made, send traffic, and tear it all down. Everything happens in network
# namespaces this script creates (the node itself is a namespace); the root namespace is
# never touched, and everything is removed on exit, also on failure.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
prefix=$(mktemp -d /tmp/cni-demo.XXXXXX)
id=$$
host=demo-node-$id
pods=()
pids=()

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ %s\n' "$*"; "$@" | sed 's/^/    /'; }
in_host() { nsenter --net=/run/netns/$host "$@"; }

cleanup() {
    set +e
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pods[@]}"; do ip netns del "$p" 2>/dev/null; done
    ip netns del "$host" 2>/dev/null
    rm -rf "$prefix"
}
trap cleanup EXIT

# Runs one plugin exactly as a runtime does: CNI_* in the environment, the config on stdin,
# inside the node's namespace. Prints the plugin's stdout.
cni() {
    local command=$1 plugin=$2 container=$3 netns=$4 ifname=$5 config=$6
    CNI_COMMAND=$command CNI_CONTAINERID=$container CNI_NETNS=$netns CNI_IFNAME=$ifname \
        CNI_PATH=$prefix/bin in_host "$prefix/bin/$plugin" <<<"$config"
}

"$top/scripts/deps.sh" demo

step "build (release) and install into $prefix"
"$top/scripts/install.sh" --bin-dir "$prefix/bin" --conf-dir "$prefix/net.d" --with-conf
printf '$ CNI_COMMAND=VERSION %s/bin/bridge\n    ' "$prefix"
CNI_COMMAND=VERSION "$prefix/bin/bridge" </dev/null

step "a node: network namespace $host"
ip netns add "$host"
in_host ip link set lo up

step "the fabric daemon: flanneld takes a subnet lease for the node and writes subnet.env"
# The node's uplink, as on a real machine: flanneld picks the default route's interface.
in_host ip link add eth0 type veth peer name uplink0
in_host ip addr add 192.168.50.2/24 dev eth0
in_host ip link set eth0 up
in_host ip link set uplink0 up
in_host ip route add default via 192.168.50.1 dev eth0 onlink
mkdir -p "$prefix/registry" "$prefix/run/flannel"
echo '{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}' >"$prefix/registry/config"
show cat "$prefix/registry/config"
# No --etcd-endpoints: the embedded registry, a directory the node's daemons share.
in_host "$prefix/bin/flanneld" --registry-dir "$prefix/registry" \
    --subnet-file "$prefix/run/flannel/subnet.env" --ip-masq 2>"$prefix/flanneld.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$prefix/run/flannel/subnet.env" ] && break; sleep 0.1; done
[ -s "$prefix/run/flannel/subnet.env" ] || { cat "$prefix/flanneld.log" >&2; exit 1; }
sed 's/^[^ ]* *//; s/^/    flanneld: /' "$prefix/flanneld.log"
show cat "$prefix/run/flannel/subnet.env"
show ls "$prefix/registry/subnets"
gateway=$(sed -n 's/^FLANNEL_SUBNET=\(.*\)\/.*/\1/p' "$prefix/run/flannel/subnet.env")

# The stock kube-flannel conflist (testdata/10-flannel.conflist), with the file locations
# pointed into the prefix. Each plugin receives the list's name and cniVersion.
flannel_conf="{\"cniVersion\":\"0.3.1\",\"name\":\"cbr0\",\"type\":\"flannel\",
  \"subnetFile\":\"$prefix/run/flannel/subnet.env\",\"dataDir\":\"$prefix/lib/cni/flannel\",
  \"ipam\":{\"dataDir\":\"$prefix/lib/cni/networks\"},
  \"delegate\":{\"hairpinMode\":true,\"isDefaultGateway\":true}}"
loopback_conf='{"cniVersion":"0.3.1","name":"cbr0","type":"loopback"}'

for i in 1 2; do
    pod=demo-pod$i-$id
    container=demo-container-$i-$id
    step "pod $i: namespace $pod, then loopback, flannel (-> bridge -> host-local) and portmap"
    ip netns add "$pod"
    pods+=("$pod")
    show cni ADD loopback "$container" "/run/netns/$pod" lo "$loopback_conf"
    result=$(cni ADD flannel "$container" "/run/netns/$pod" eth0 "$flannel_conf")
    printf '$ flannel ADD ->\n    %s\n' "$result"
    mappings='[]'
    [ "$i" = 1 ] && mappings='[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]'
    portmap_conf="{\"cniVersion\":\"0.3.1\",\"name\":\"cbr0\",\"type\":\"portmap\",
      \"capabilities\":{\"portMappings\":true},\"runtimeConfig\":{\"portMappings\":$mappings},
      \"prevResult\":$result}"
    cni ADD portmap "$container" "/run/netns/$pod" eth0 "$portmap_conf" >/dev/null
    show ip -n "$pod" -br addr show eth0
    show ip -n "$pod" route
done

step "what the node holds now"
show in_host ip -br link
show in_host ip -br addr show cni0
show ls "$prefix/lib/cni/networks/cbr0" "$prefix/lib/cni/flannel"
show sh -c "nsenter --net=/run/netns/$host iptables-save -t nat | grep -E 'CNI|cbr0'"

step "traffic: pod 2 pings pod 1; the node reaches pod 1's web server through host port 8080"
mkdir -p "$prefix/www" && echo "hello from pod 1" >"$prefix/www/index.html"
ip netns exec "demo-pod1-$id" busybox httpd -f -p 80 -h "$prefix/www" &
pids+=($!)
sleep 0.3
pod1_ip=$(ip -n "demo-pod1-$id" -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
show ip netns exec "demo-pod2-$id" busybox ping -c 2 -W 1 "$pod1_ip"
printf '$ GET http://%s:8080/ from the node\n' "$gateway"
printf 'GET / HTTP/1.0\r\n\r\n' | in_host socat -t 2 - "TCP:$gateway:8080" | sed 's/^/    /'

step "tear down in reverse, as the runtime does at pod removal"
for i in 2 1; do
    pod=demo-pod$i-$id
    container=demo-container-$i-$id
    mappings='[]'
    [ "$i" = 1 ] && mappings='[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]'
    # As at ADD, the runtime passes the mappings again; DEL needs no prevResult.
    cni DEL portmap "$container" "/run/netns/$pod" eth0 \
        "{\"cniVersion\":\"0.3.1\",\"name\":\"cbr0\",\"type\":\"portmap\",\"capabilities\":{\"portMappings\":true},\"runtimeConfig\":{\"portMappings\":$mappings}}"
    cni DEL flannel "$container" "/run/netns/$pod" eth0 "$flannel_conf"
    cni DEL loopback "$container" "/run/netns/$pod" lo "$loopback_conf"
done
show ls -A "$prefix/lib/cni/networks/cbr0" "$prefix/lib/cni/flannel"
printf '$ iptables-save -t nat on the node, rules naming the containers:\n'
in_host iptables-save -t nat | grep "demo-container" | sed 's/^/    /' || echo "    (none)"
step "done: the namespaces and $prefix are removed on exit"
