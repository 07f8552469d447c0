#!/usr/bin/env bash
# Builds the suite in release mode and installs the plugins (and the fabric daemon, once it
# exists) into a CNI bin directory, and, only when asked, the conflists into a conf directory.
# Each file is replaced by a rename, so a runtime exec'ing a plugin mid-install sees either the
# old binary or the new one, never a half-written file.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--bin-dir DIR] [--conf-dir DIR] [--with-conf] [--no-build]
  --bin-dir DIR   where the plugins go (default /opt/cni/bin)
  --conf-dir DIR  where the conflists go with --with-conf (default /etc/cni/net.d)
  --with-conf     also install testdata/*.conflist
  --no-build      install what target/release already holds
USAGE
}

bin_dir=/opt/cni/bin
conf_dir=/etc/cni/net.d
with_conf=0
build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
        --conf-dir) conf_dir=${2:?--conf-dir needs a directory}; shift 2 ;;
        --with-conf) with_conf=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
plugins=(flannel bridge host-local portmap loopback)
daemons=(flanneld)
target_dir=${CARGO_TARGET_DIR:-$top/target}

# Release binaries are linked statically (crt-static): a plugin is exec'd for every pod, and
# skipping the dynamic loader saves about a fifth of a millisecond per exec. Naming the target
# explicitly keeps the flag off build scripts and proc-macros, which cannot be static.
host_triple=""
if command -v rustc >/dev/null; then
    host_triple=$(rustc -vV | sed -n 's/^host: //p')
fi
if [ "$build" = 1 ]; then
    (cd "$top" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --release --locked --quiet --target "$host_triple")
fi
target=$target_dir/release
if [ -n "$host_triple" ] && [ -x "$target_dir/$host_triple/release/${plugins[0]}" ]; then
    target=$target_dir/$host_triple/release
fi

# Copies $1 to $2/$3 through a temporary name in the same directory, then renames it into place.
place() {
    local src=$1 dir=$2 name=$3 mode=$4
    local tmp
    tmp=$(mktemp "$dir/.$name.XXXXXX")
    cp "$src" "$tmp"
    chmod "$mode" "$tmp"
    sync -d "$tmp" 2>/dev/null || true
    mv -f "$tmp" "$dir/$name"
    echo "installed $dir/$name"
}

# All or nothing: a missing binary stops the install before any plugin is replaced.
for p in "${plugins[@]}"; do
    [ -x "$target/$p" ] || { echo "missing $target/$p: build first or drop --no-build" >&2; exit 1; }
done
mkdir -p "$bin_dir"
for p in "${plugins[@]}"; do
    place "$target/$p" "$bin_dir" "$p" 0755
done
for d in "${daemons[@]}"; do
    if [ -x "$target/$d" ]; then
        place "$target/$d" "$bin_dir" "$d" 0755
    fi
done

if [ "$with_conf" = 1 ]; then
    mkdir -p "$conf_dir"
    shopt -s nullglob
    for c in "$top"/testdata/*.conflist; do
        place "$c" "$conf_dir" "$(basename "$c")" 0644
    done
fi
