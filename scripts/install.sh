#!/usr/bin/env bash
# Builds the suite in release mode and installs the plugins into a CNI bin directory, and, only
# when asked, the conflists into a conf directory and the fabric daemon with its systemd unit.
# Each file is replaced by a rename, so a runtime exec'ing a plugin mid-install sees either the
# old binary or the new one, never a half-written file.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--bin-dir DIR] [--conf-dir DIR] [--with-conf] [--daemon [--daemon-bin-dir DIR]
          [--systemd-dir DIR] [--env-file PATH]] [--no-build]
  --bin-dir DIR         where the five plugins go (default /opt/cni/bin)
  --conf-dir DIR        where the conflists go with --with-conf (default /etc/cni/net.d)
  --with-conf           also install testdata/*.conflist
  --daemon              also install the fabric daemon:
                          flanneld            into --daemon-bin-dir (default /usr/local/bin),
                          flannel-wireguard   beside it (the wireguard backend's userspace tunnel)
                          flannel-udp         beside it (the udp backend's tunnel)
                          flannel-netpol      beside it (NetworkPolicy, a unit of its own)
                          flanneld.service    into --systemd-dir (default /etc/systemd/system),
                                              its ExecStart= and EnvironmentFile= pointing there
                          flanneld.env        as --env-file (default /etc/default/flanneld),
                                              only if that file does not exist yet; either
                                              way it is made root's, mode 0600 (it may
                                              hold FLANNELD_ETCD_PASSWORD)
                          flannel-netpol.service and flannel-netpol.env (as flannel-netpol
                                              beside --env-file, only if absent) likewise
                        then: systemctl daemon-reload && systemctl enable --now flanneld
                        (and flannel-netpol, once its kubeconfig is in place)
  --no-build            install what target/release already holds
USAGE
}

bin_dir=/opt/cni/bin
conf_dir=/etc/cni/net.d
with_conf=0
build=1
daemon=0
daemon_bin_dir=/usr/local/bin
systemd_dir=/etc/systemd/system
env_file=/etc/default/flanneld
while [ $# -gt 0 ]; do
    case "$1" in
        --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
        --conf-dir) conf_dir=${2:?--conf-dir needs a directory}; shift 2 ;;
        --with-conf) with_conf=1; shift ;;
        --daemon) daemon=1; shift ;;
        --daemon-bin-dir) daemon_bin_dir=${2:?--daemon-bin-dir needs a directory}; shift 2 ;;
        --systemd-dir) systemd_dir=${2:?--systemd-dir needs a directory}; shift 2 ;;
        --env-file) env_file=${2:?--env-file needs a path}; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for d in "$daemon_bin_dir" "$systemd_dir" "$env_file"; do
    case "$d" in
        *[[:space:]\|\&]*) echo "$d: the unit names it, so no blank, | or & in it" >&2; exit 2 ;;
        /*) ;;
        *) echo "$d: the unit names it, so it must be an absolute path" >&2; exit 2 ;;
    esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
plugins=(flannel bridge host-local portmap loopback)
# flannel-wireguard: the wireguard backend's userspace tunnel, which flanneld runs from beside itself.
# flannel-udp: the udp backend's tunnel, run the same way.
# flannel-netpol: NetworkPolicy for the node's pods, a unit of its own.
daemons=(flanneld flannel-wireguard flannel-udp flannel-netpol)
target_dir=${CARGO_TARGET_DIR:-$top/target}

# Release binaries are linked statically (crt-static): a plugin is exec'd for every pod, and
# skipping the dynamic loader saves about a fifth of a millisecond per exec. Naming the target
# explicitly keeps the flag off build scripts and proc-macros, which cannot be static.
host_triple=""
if command -v rustc >/dev/null; then
    host_triple=$(rustc -vV | sed -n 's/^host: //p')
fi
# Only the binaries installed here: the rest of the workspace (test support, the end-to-end
# harness) costs release builds minutes and is not installed.
if [ "$build" = 1 ]; then
    bins=()
    for b in "${plugins[@]}" "${daemons[@]}"; do bins+=(--bin "$b"); done
    (cd "$top" && RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --release --locked --quiet --target "$host_triple" "${bins[@]}")
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

# Makes $1 readable and writable by root only; says so when it was not (the secrets it held
# were readable by whoever could read it until now).
restrict_to_root() {
    local file=$1 was
    was=$(stat -L -c '%a %u:%g' "$file")
    chmod 0600 "$file"
    if [ "$(id -u)" != 0 ]; then
        echo "not root: $file is mode 0600 but stays owned by $(id -un); make it root's" >&2
        return
    fi
    chown 0:0 "$file"
    if [ "$was" != "600 0:0" ]; then
        echo "restricted $file to root, mode 0600 (it was mode ${was% *}, owner ${was#* }):" \
            "change any password it held if others could read it" >&2
    fi
}

# All or nothing: a missing file stops the install before anything is replaced.
wanted=("${plugins[@]}")
[ "$daemon" = 1 ] && wanted+=("${daemons[@]}")
for p in "${wanted[@]}"; do
    [ -x "$target/$p" ] || { echo "missing $target/$p: build first or drop --no-build" >&2; exit 1; }
done
unit_src=$top/deploy/systemd/flanneld.service
env_src=$top/deploy/systemd/flanneld.env
netpol_unit_src=$top/deploy/systemd/flannel-netpol.service
netpol_env_src=$top/deploy/systemd/flannel-netpol.env
netpol_env_file=$(dirname "$env_file")/flannel-netpol
if [ "$daemon" = 1 ]; then
    for f in "$unit_src" "$env_src" "$netpol_unit_src" "$netpol_env_src"; do
        [ -f "$f" ] || { echo "missing $f" >&2; exit 1; }
    done
fi

mkdir -p "$bin_dir"
for p in "${plugins[@]}"; do
    place "$target/$p" "$bin_dir" "$p" 0755
done

if [ "$daemon" = 1 ]; then
    mkdir -p "$daemon_bin_dir" "$systemd_dir" "$(dirname "$env_file")"
    for d in "${daemons[@]}"; do
        place "$target/$d" "$daemon_bin_dir" "$d" 0755
    done
    unit=$(mktemp)
    trap 'rm -f "$unit"' EXIT
    sed -e "s|^ExecStart=/usr/local/bin/flanneld|ExecStart=$daemon_bin_dir/flanneld|" \
        -e "s|^EnvironmentFile=/etc/default/flanneld|EnvironmentFile=$env_file|" \
        "$unit_src" >"$unit"
    place "$unit" "$systemd_dir" flanneld.service 0644
    # The environment file is the operator's configuration (it may hold FLANNELD_ETCD_PASSWORD):
    # its content is never replaced, but it is made root's and 0600 whatever it was, so that
    # an upgrade also closes a file an earlier install left readable by every user.
    if [ -e "$env_file" ]; then
        echo "kept $env_file"
    else
        place "$env_src" "$(dirname "$env_file")" "$(basename "$env_file")" 0600
    fi
    restrict_to_root "$env_file"
    sed -e "s|^ExecStart=/usr/local/bin/flannel-netpol|ExecStart=$daemon_bin_dir/flannel-netpol|" \
        -e "s|^EnvironmentFile=/etc/default/flannel-netpol|EnvironmentFile=$netpol_env_file|" \
        "$netpol_unit_src" >"$unit"
    place "$unit" "$systemd_dir" flannel-netpol.service 0644
    if [ -e "$netpol_env_file" ]; then
        echo "kept $netpol_env_file"
    else
        place "$netpol_env_src" "$(dirname "$netpol_env_file")" flannel-netpol 0644
    fi
fi

if [ "$with_conf" = 1 ]; then
    mkdir -p "$conf_dir"
    shopt -s nullglob
    for c in "$top"/testdata/*.conflist; do
        place "$c" "$conf_dir" "$(basename "$c")" 0644
    done
fi
