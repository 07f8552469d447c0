# containerd 1.6 (Debian's) with its CRI plugin, started for this session only: config, root,
# state and socket in $WORK/containerd, the CNI plugins from $WORK/bin and the conflist from
# $WORK/net.d as a kubelet node's containerd is configured (grafted over /opt/cni/bin and
# /etc/cni/net.d too, and an empty directory over /usr/lib/cni: only the set under test runs).
# The pod sandbox image is IMAGE_TAR (tagged IMAGE_REF), imported for the CRI's namespace; the
# test drives the CRI socket while the session is paused.
graft "$WORK/net.d" /etc/cni/net.d || exit 1
graft "$WORK/bin" /opt/cni/bin || exit 1
graft "$WORK/empty" /usr/lib/cni || exit 1

C=$WORK/containerd
mkdir -p "$C"
cat >"$C/config.toml" <<CONF
version = 2
root = "$C/root"
state = "$C/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$C/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$C/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$IMAGE_REF"
  disable_apparmor = true
  # No lower OOM score than containerd's own: lowering it needs CAP_SYS_RESOURCE, which a
  # test machine (itself often a container) may not give.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$WORK/bin"
    conf_dir = "$WORK/net.d"
    max_conf_num = 1
CONF
containerd --config "$C/config.toml" >"$C/containerd.log" 2>&1 &
containerd_pid=$!
ctr=(ctr --address "$C/containerd.sock" --namespace k8s.io)

# Whatever the test left running goes without CNI: the node's namespace goes with the test.
cleanup() {
    local t
    for t in $("${ctr[@]}" task ls --quiet 2>/dev/null); do
        "${ctr[@]}" task kill --signal SIGKILL "$t" >/dev/null 2>&1
        "${ctr[@]}" task delete --force "$t" >/dev/null 2>&1
    done
    for t in $("${ctr[@]}" container ls --quiet 2>/dev/null); do
        "${ctr[@]}" container delete "$t" >/dev/null 2>&1
    done
    kill "$containerd_pid" && wait "$containerd_pid"
}
trap cleanup EXIT

containerd_up() {
    local _
    for _ in $(seq 100); do
        "${ctr[@]}" version >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    cat "$C/containerd.log"
    return 1
}

step containerd containerd_up || exit 1
step import "${ctr[@]}" image import --snapshotter native "$IMAGE_TAR" || exit 1
pause

step containers "${ctr[@]}" container ls --quiet
step tasks "${ctr[@]}" task ls --quiet
step log cat "$C/containerd.log"
