#!/usr/bin/env bash
# Crash-injection soak: `scripts/soak.sh [cycles] [seed]` runs that many pods (default 1000)
# through the stock flannel conflist with portmap, on a throwaway node namespace, while a
# share of the plugin processes is SIGKILLed mid-run; once with portmap's iptables backend and
# once with nftables. Prints what the node still held, if anything, and exits non-zero then.
# The daemon's soak: `scripts/soak.sh --daemon [seconds]` (default 3600) churns a three-node
# cluster on etcd (nodes joining and leaving at 10/s, pods added and deleted through the
# plugins at up to 20/s), holds each flanneld's RSS and open descriptors to 5% after a warm-up
# of 5 minutes, and fails on anything left behind or an address handed out twice
# (pkg/e2e/src/daemon_soak.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "the soak creates network namespaces: run as root" >&2
    exit 1
fi
if [ "${1:-}" = --daemon ]; then
    cargo build --workspace --bins --quiet
    exec target/debug/daemon-soak "${2:-3600}"
fi
cycles="${1:-1000}"
seed="${2:-}"
cargo build --workspace --bins --quiet
status=0
for backend in iptables nftables; do
    # shellcheck disable=SC2086 # an empty seed is no argument
    target/debug/soak "$cycles" "$backend" $seed || status=1
done
exit "$status"
