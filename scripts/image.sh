#!/usr/bin/env bash
# Builds the container image deploy/kubernetes/*.yml run, with podman, where no container
# registry is reachable: its base is a Debian root filesystem made by mmdebstrap (the release of
# deploy/Dockerfile's base, holding iptables and nftables and nothing to build with), and the
# image adds the static release binaries and deploy/cni-install.sh through
# deploy/Dockerfile.prebuilt, as kube-flannel's image takes binaries built beforehand.
# Tags: flannel-cni-rs:<version> (podman's localhost/flannel-cni-rs:<version>, the manifests'
# image) and flannel-cni-rs:<version>-<commit>, the commit's first 12 hex digits with -dirty
# after them when `git diff --quiet HEAD` finds tracked files changed, the rule flanneld
# --version follows; the same string is the image's org.opencontainers.image.revision label.
# Prints the image's size, and its name as the last line.
set -euo pipefail

usage() {
    cat <<USAGE
usage: $0 [--no-build] [--rebuild-base] | --systemd-node
  --no-build      take the release binaries target/ already holds (CARGO_TARGET_DIR if set)
  --rebuild-base  make the base again even if podman already has it
  --systemd-node  make only the image of a node that systemd boots, for the test of the units
                  under a real service manager (pkg/e2e/tests/systemd.rs): mmdebstrap of the
                  same release with systemd and the tools flanneld and flannel-netpol run
                  (iproute2, iptables, nftables), tagged flannel-cni-rs-systemd-node:<release>
USAGE
}

build=1
rebuild_base=0
systemd_node=0
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0; shift ;;
        --rebuild-base) rebuild_base=1; shift ;;
        --systemd-node) systemd_node=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "mmdebstrap and podman's image store need root: run as root" >&2; exit 1; }

top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install $tool" >&2; exit 1; }
done

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
commit=$(git rev-parse HEAD 2>/dev/null) || { echo "$top is not a git checkout: the tag names its commit" >&2; exit 1; }
revision=${commit:0:12}
git diff --quiet HEAD || revision=$revision-dirty
# The Debian release of deploy/Dockerfile's base (debian:bookworm-slim): the same for both builds.
release=$(sed -n 's/^ARG BASE=debian:\([a-z]*\).*/\1/p' deploy/Dockerfile.prebuilt)
[ -n "$release" ] || { echo "deploy/Dockerfile.prebuilt names no Debian release in ARG BASE" >&2; exit 1; }
base=localhost/flannel-cni-rs-base:$release
name=localhost/flannel-cni-rs

work=$(mktemp -d /tmp/flannel-cni-rs-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

# apt sources for $release on the Debian mirrors this machine's apt uses (the host may run
# another release): its plain, -updates and -security suites. Not Debian, or none found:
# mmdebstrap's default mirror.
release_sources() {
    (. /etc/os-release && [ "${ID:-}" = debian ]) || return 0
    apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null |
        sed -n -E "s#^([^ ]+) [a-z]+(-updates|-security)?\$#deb \\1 $release\\2 main#p" | sort -u
}

# An image of ours that a new build took the tags from is removed, not left dangling.
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
drop_if_untagged() {
    [ -n "$1" ] && [ "$(podman image inspect --format '{{len .RepoTags}}' "$1" 2>/dev/null)" = 0 ] &&
        podman rmi "$1" >/dev/null 2>&1 || true
}

# mmdebstrap of $release: variant $1 with the packages $2 (comma-separated) into the tarball $3,
# the rest of the arguments given to mmdebstrap; its log is shown only when it fails. /usr is
# merged as on an installed system, without the usrmerge package (and the perl it brings).
make_rootfs() {
    local variant=$1 include=$2 tarball=$3
    shift 3
    local sources=() hooks=()
    while read -r line; do sources+=("$line"); done < <(release_sources)
    [ -d /usr/share/mmdebstrap/hooks/merged-usr ] && hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
    mmdebstrap --variant="$variant" --include="$include" --quiet "${hooks[@]}" "$@" \
        "$release" "$tarball" "${sources[@]}" >"$work/mmdebstrap.log" 2>&1 ||
        { cat "$work/mmdebstrap.log" >&2; echo "mmdebstrap failed" >&2; exit 1; }
}

if [ "$systemd_node" = 1 ]; then
    node=localhost/flannel-cni-rs-systemd-node:$release
    old_node=$(image_id "$node")
    echo "$node: mmdebstrap $release with systemd, iproute2, iptables and nftables"
    make_rootfs minbase systemd,systemd-sysv,iproute2,iptables,nftables "$work/node.tar"
    podman import --quiet --change 'CMD ["/sbin/init"]' \
        --message "Debian $release (mmdebstrap minbase) booted by systemd" \
        "$work/node.tar" "$node" >/dev/null
    drop_if_untagged "$old_node"
    echo "$node"
    exit 0
fi

# The binaries as scripts/install.sh builds them (static, in the host triple's directory), so
# that the demo's build and this one share their work.
host_triple=$(rustc -vV 2>/dev/null | sed -n 's/^host: //p' || true)
target=${CARGO_TARGET_DIR:-$top/target}/$host_triple/release
if [ "$build" = 1 ]; then
    [ -n "$host_triple" ] || { echo "no rustc to build with: install a Rust toolchain or give --no-build" >&2; exit 1; }
    echo "building the static release binaries into $target"
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
        cargo build --release --locked --quiet --target "$host_triple" \
        --bin flannel --bin bridge --bin host-local --bin portmap --bin loopback --bin flanneld \
        --bin flannel-wireguard --bin flannel-udp --bin flannel-netpol
fi
mkdir -p "$work/context/cni"
for p in flannel bridge host-local portmap loopback; do
    [ -x "$target/$p" ] || { echo "missing $target/$p: build first or drop --no-build" >&2; exit 1; }
    cp "$target/$p" "$work/context/cni/"
done
for d in flanneld flannel-wireguard flannel-udp flannel-netpol; do
    [ -x "$target/$d" ] || { echo "missing $target/$d: build first or drop --no-build" >&2; exit 1; }
    cp "$target/$d" "$work/context/"
done
cp deploy/cni-install.sh "$work/context/"

old_base=$(image_id "$base")
old_image=$(image_id "$name:$version")

if [ "$rebuild_base" = 1 ] || [ -z "$old_base" ]; then
    echo "base $base: mmdebstrap $release with iptables and nftables"
    # As Debian's slim images: no documentation, manuals or translations, copyrights kept.
    make_rootfs minbase iptables,nftables "$work/base.tar" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    # flanneld writes its rules through whichever iptables holds the host's (--iptables-mode):
    # the base carries both, legacy and nft, as Debian's iptables package does.
    # Listed once, whole: grep -q ending a pipe from tar early would fail it (pipefail).
    listing=$(tar -tf "$work/base.tar")
    for tool in iptables-legacy-restore ip6tables-legacy-restore iptables-nft-restore ip6tables-nft-restore; do
        grep -qE "^(\./)?usr/sbin/$tool\$" <<<"$listing" ||
            { echo "the base lacks /usr/sbin/$tool: flanneld needs iptables-legacy and iptables-nft" >&2; exit 1; }
    done
    podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        --message "Debian $release (mmdebstrap minbase) with iptables and nftables" \
        "$work/base.tar" "$base" >/dev/null
    rm -f "$work/base.tar"
else
    echo "base $base: already made (--rebuild-base makes it again)"
fi

# --no-cache: a cached layer would keep the labels of the build it came from.
podman build --quiet --pull=never --no-cache -f deploy/Dockerfile.prebuilt \
    --build-arg BASE="$base" --build-arg VERSION="$version" --build-arg REVISION="$revision" \
    -t "$name:$version" -t "$name:$version-$revision" "$work/context" >/dev/null

drop_if_untagged "$old_image"
drop_if_untagged "$old_base"

size=$(podman image inspect --format '{{.Size}}' "$name:$version-$revision")
base_size=$(podman image inspect --format '{{.Size}}' "$base")
printf 'image %s:%s, also %s:%s (flannel-cni-rs:%s to the manifests)\n' \
    "$name" "$version-$revision" "$name" "$version" "$version"
printf 'size %s MB: base %s MB, binaries and cni-install.sh %s MB\n' \
    "$((size / 1000000))" "$((base_size / 1000000))" "$(((size - base_size) / 1000000))"
echo "$name:$version-$revision"
