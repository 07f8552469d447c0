#!/usr/bin/env bash
# Crash-injection soak: `scripts/soak.sh [cycles] [seed]` runs that many pods (default 1000)
# through the stock flannel conflist with portmap, on a throwaway node namespace, while a
# share of the plugin processes is SIGKILLed mid-run; once with portmap's iptables backend and
# once with nftables. Prints what the node still held, if anything, and exits non-zero then.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "the soak creates network namespaces: run as root" >&2
    exit 1
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
