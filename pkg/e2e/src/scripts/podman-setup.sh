# podman with its CNI backend, every setting in a containers.conf and storage.conf under $WORK:
# plugins from $WORK/bin, conflists from $WORK/net.d, runc with cgroupfs, vfs storage.
P=$WORK/podman
mkdir -p "$P"
cat >"$P/containers.conf" <<CONF
[containers]
# podman's defaults exceed the hard limits here and raising them needs CAP_SYS_RESOURCE.
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$P/events.log"
tmp_dir = "$P/tmp"

[network]
network_backend = "cni"
cni_plugin_dirs = ["$WORK/bin"]
network_config_dir = "$WORK/net.d"
CONF
cat >"$P/storage.conf" <<CONF
[storage]
driver = "vfs"
graphroot = "$P/storage"
runroot = "$P/runroot"
CONF
export CONTAINERS_CONF=$P/containers.conf CONTAINERS_STORAGE_CONF=$P/storage.conf

trap 'podman rm --all --force --time 0 >/dev/null 2>&1' EXIT

# start_web NAME HOST_PORT: runs container NAME from ROOTFS serving HTTP on PORT, published on
# HOST_PORT, and looks at its network from inside (steps run, inspect, addr, link, routes, ping;
# with GATEWAY6 set, also inspect6, addr6, routes6, ping6).
start_web() {
    step run podman run --detach --name "$1" --network "$NETWORK" \
        --cgroup-parent "$CGROUP_PARENT" --publish "$2:$PORT" --rootfs "$ROOTFS" \
        /bin/busybox httpd -f -p "$PORT" -h /www || exit 1
    step inspect podman inspect --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"
    step addr podman exec "$1" ip -o -4 addr show dev eth0
    step link podman exec "$1" ip -o link show dev eth0
    step routes podman exec "$1" ip -4 route show
    step ping podman exec "$1" ping -c 1 -W 2 "$GATEWAY"
    if [ -n "${GATEWAY6:-}" ]; then
        step inspect6 podman inspect --format '{{range .NetworkSettings.Networks}}{{.GlobalIPv6Address}}{{end}}' "$1"
        step addr6 podman exec "$1" ip -o -6 addr show dev eth0 scope global
        step routes6 podman exec "$1" ip -6 route show
        step ping6 podman exec "$1" ping -c 1 -W 2 "$GATEWAY6"
    fi
}
