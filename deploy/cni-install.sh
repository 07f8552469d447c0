#!/bin/sh
# The DaemonSet's init step (deploy/kubernetes/flanneld.yml): puts the five plugins into the
# host's CNI bin directory and the conflist into its CNI conf directory. Each file is copied to
# a temporary name beside its destination and renamed into place, so a runtime exec'ing a
# plugin meanwhile gets the old binary or the new one, never a partial file.
set -eu

usage() {
    cat <<USAGE
usage: $0 [--root DIR] [--from DIR] [--conflist FILE]   (also --flag=value)
  --root DIR       the host's root as mounted in the container (default /host)
  --from DIR       where the image keeps the plugins (default /opt/flannel-cni-rs/bin)
  --conflist FILE  the conflist to install (default /etc/kube-flannel/cni-conf.json)
Installs ROOT/opt/cni/bin/{flannel,bridge,host-local,portmap,loopback} (0755) and
ROOT/etc/cni/net.d/10-flannel.conflist (0644).
USAGE
}

root=/host
from=/opt/flannel-cni-rs/bin
conflist=/etc/kube-flannel/cni-conf.json
while [ $# -gt 0 ]; do
    case "$1" in
        --root) root=${2:?--root needs a directory}; shift 2 ;;
        --from) from=${2:?--from needs a directory}; shift 2 ;;
        --conflist) conflist=${2:?--conflist needs a file}; shift 2 ;;
        --root=*) root=${1#*=}; shift ;;
        --from=*) from=${1#*=}; shift ;;
        --conflist=*) conflist=${1#*=}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

plugins="flannel bridge host-local portmap loopback"
bin_dir=$root/opt/cni/bin
conf_dir=$root/etc/cni/net.d

# All or nothing: a missing source stops the step before anything on the host is replaced.
for p in $plugins; do
    [ -x "$from/$p" ] || { echo "missing $from/$p" >&2; exit 1; }
done
[ -f "$conflist" ] || { echo "missing $conflist" >&2; exit 1; }

place() {
    src=$1 dir=$2 name=$3 mode=$4
    tmp=$(mktemp "$dir/.$name.XXXXXX")
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    mv -f "$tmp" "$dir/$name"
    echo "installed $dir/$name"
}

mkdir -p "$bin_dir" "$conf_dir"
for p in $plugins; do
    place "$from/$p" "$bin_dir" "$p" 0755
done
place "$conflist" "$conf_dir" 10-flannel.conflist 0644
