#!/usr/bin/env bash
# Side-by-side benchmarks against Debian's Go plugins (/usr/lib/cni), each in the same run and in
# throwaway namespaces: host-local, bridge (+host-local), flannel (-> bridge -> host-local), portmap;
# and the daemon flanneld against a real etcd (no Go flanneld is packaged to compare with), beside
# the kernel's own batch tools writing the same entries as plain routes and through nexthop objects
# (benches/route_styles.rs; ROUTE_STYLES_N=1000,5000 picks its sizes, 50,000 takes minutes), and
# flanneld's own time from the etcd commit to the last kernel notification and its RSS
# (benches/datapath_burst.rs; DATAPATH_N=1000,5000 picks its sizes), and the same for wireguard
# leases with its userspace tunnel, flannel-wireguard (benches/wireguard_burst.rs; WIREGUARD_N).
# The WireGuard tunnel against wireguard-go is scripts/bench-wireguard.sh.
# Needs root and the containernetworking-plugins package. Pass plugin names to run only some.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmarks create network namespaces" >&2; exit 1; }
[ -x /usr/lib/cni/bridge ] || { echo "apt-get install containernetworking-plugins first" >&2; exit 1; }
# The same static release build scripts/install.sh makes, so the figures are those of an install.
host_triple=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
cargo build --release --locked --quiet --target "$host_triple" \
    --bin flannel --bin bridge --bin host-local --bin portmap --bin loopback --bin flanneld \
    --bin flannel-wireguard
for p in "${@:-host-local bridge flannel portmap flanneld}"; do
    for q in $p; do
        printf '\n== %s\n' "$q"
        cargo bench --locked --quiet --target "$host_triple" -p "$q"
    done
done
