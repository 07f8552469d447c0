#!/usr/bin/env bash
# The README's first two commands on a fresh machine, as a new user runs them: a Debian bookworm
# root filesystem made by mmdebstrap (apt and nothing else), this checkout as `git archive HEAD`
# gives it, the host's Rust toolchain mounted read-only, and `scripts/demo.sh` run to its end as
# root in a privileged podman container; then `scripts/deps.sh tests` and a build of every test
# target there. Whatever the demo and the tests need beyond the toolchain, scripts/deps.sh must
# install, or it fails here; no kernel image may come with it. Afterwards no namespace or demo
# process may be left in the container, and the machine's root namespace has the links it had.
#   scripts/fresh-machine.sh [--share-target] [DEMO ARGUMENTS...]
#   --share-target   the container builds into this checkout's target/, which must hold no
#                    build yet; cargo on the host then finds the demo's release build and the
#                    test build up to date (scripts/image.sh --no-build, scripts/test.sh) and
#                    builds nothing again. Without it, into a target/ removed at the end.
# The container sees the checkout, the toolchain and the host's cargo home (its registry: crates
# already downloaded are not downloaded again) at their paths on the host, so that cargo's
# fingerprints of what it builds hold on the host too; nothing built is taken from the host.
# It shares the host's network namespace, as apt and cargo need the mirrors; the demo makes its
# own namespaces and touches nothing else. Everything else is made under a temporary directory
# and removed at the end, podman's store with it.
set -euo pipefail

share_target=0
while [ $# -gt 0 ]; do
    case "$1" in
        --share-target) share_target=1; shift ;;
        -h|--help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) break ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "mmdebstrap and a privileged container need root: run as root" >&2; exit 1; }
top=$(cd "$(dirname "$0")/.." && pwd)
for tool in mmdebstrap podman git rustc; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/deps.sh tests installs mmdebstrap and podman)" >&2; exit 1; }
done
release=bookworm
sysroot=$(rustc --print sysroot)
[ -x "$sysroot/bin/cargo" ] || { echo "no cargo beside rustc in $sysroot: the container gets that toolchain" >&2; exit 1; }
cargo_home=$(cd "${CARGO_HOME:-$HOME/.cargo}" && pwd)
if [ "$share_target" = 1 ] && [ -n "$(ls -A "$top/target" 2>/dev/null)" ]; then
    echo "$top/target holds a build: the container must build from nothing (remove it, or run without --share-target)" >&2
    exit 1
fi

work=$(mktemp -d /var/tmp/flannel-cni-rs-fresh.XXXXXX)
name=flannel-cni-rs-fresh-$$
export CONTAINERS_CONF=$work/containers.conf CONTAINERS_STORAGE_CONF=$work/storage.conf
cleanup() {
    local status=$?
    set +e
    podman rm --force --time 0 "$name" >/dev/null 2>&1
    podman rmi --all --force >/dev/null 2>&1
    # Whatever podman still has mounted under its store goes before the store itself.
    findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount -l 2>/dev/null
    rm -rf "$work"
    exit $status
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# podman's own settings and store, under $work only. Its default rlimits and its
# net.ipv4.ping_group_range sysctl are refused on some machines (this one among them).
cat >"$work/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
default_sysctls = []
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$work/events.log"
tmp_dir = "$work/tmp"
CONF
cat >"$work/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/runroot"
CONF

elapsed() { echo "$(( $(date +%s) - $1 )) s"; }
root_links() { ip -o link show | awk -F': ' '{print $2}' | sort; }
before=$(root_links)

# apt sources for $release on the Debian mirrors this machine's apt uses; not Debian, or none
# found: mmdebstrap's own.
sources=()
while read -r line; do sources+=("$line"); done < <(
    (. /etc/os-release && [ "${ID:-}" = debian ]) || exit 0
    apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null |
        sed -n -E "s#^([^ ]+) [a-z]+(-updates|-security)?\$#deb \\1 $release\\2 main#p" | sort -u)
t=$(date +%s)
# /usr merged as on an installed system, without the usrmerge package.
hooks=()
[ -d /usr/share/mmdebstrap/hooks/merged-usr ] && hooks=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr)
mmdebstrap --variant=apt --quiet "${hooks[@]}" "$release" "$work/rootfs.tar" "${sources[@]}" \
    >"$work/mmdebstrap.log" 2>&1 || { cat "$work/mmdebstrap.log" >&2; echo "mmdebstrap failed" >&2; exit 1; }
podman import --quiet "$work/rootfs.tar" "localhost/$name:$release" >/dev/null
rm -f "$work/rootfs.tar"
echo "fresh Debian $release root filesystem (mmdebstrap --variant=apt): $(elapsed "$t")"

mkdir -p "$work/src"
git -C "$top" archive HEAD | tar -x -C "$work/src"
[ -z "$(git -C "$top" status --porcelain --untracked-files=no)" ] ||
    echo "note: the checkout has changes that are not committed; the container gets HEAD"

# The checkout as HEAD at its own path; the target directory inside it the host's or our own.
target=$work/target
[ "$share_target" = 1 ] && target=$top/target
mkdir -p "$target"
mounts=(-v "$sysroot:$sysroot:ro" -v "$work/src:$top" -v "$target:$top/target" -v "$cargo_home:$cargo_home")
# After the demo: nothing of it may be left in the container. `times` gives the CPU time of
# everything the shell waited for (the build most of all).
check='set -e
scripts/demo.sh "$@"
left=$(ip netns list)
[ -z "$left" ] || { echo "FAILED: the demo left network namespaces: $left" >&2; exit 1; }
left=$(ps -eo pid=,comm= | grep -E " (flanneld|etcd|kube-apiserver-|busybox|socat)$" || true)
[ -z "$left" ] || { echo "FAILED: the demo left processes running: $left" >&2; exit 1; }
echo "CPU time of the demo (user, system; its children below):"; times
t=$(date +%s)
scripts/deps.sh tests
kernels=$(dpkg-query -W -f "\${Package} \${Status}\n" "linux-image-*" 2>/dev/null | grep " installed$" || true)
[ -z "$kernels" ] || { echo "FAILED: scripts/deps.sh tests installed a kernel: $kernels" >&2; exit 1; }
echo "scripts/deps.sh tests: $(( $(date +%s) - t )) s"
t=$(date +%s)
# As scripts/test.sh builds them (its nextest builds what `cargo test` does), so that the host
# finds them built.
cargo test --workspace --no-run --locked --quiet
echo "every test target built: $(( $(date +%s) - t )) s"'
t=$(date +%s)
status=0
# In the background, so that a TERM to this script reaches its cleanup at once.
podman run --rm --name "$name" --privileged --network host "${mounts[@]}" -w "$top" \
    -e CARGO_HOME="$cargo_home" -e PATH="$sysroot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "localhost/$name:$release" bash -c "$check" demo "$@" &
wait $! || status=$?
echo "scripts/demo.sh $*, scripts/deps.sh tests and the test build in the container: $(elapsed "$t"), exit status $status"

after=$(root_links)
if [ "$before" != "$after" ]; then
    echo "FAILED: the links of the root namespace changed:" >&2
    diff <(echo "$before") <(echo "$after") >&2 || true
    status=1
fi
[ "$share_target" = 1 ] && echo "the container's build is in $top/target"
[ "$status" = 0 ] && echo "PASSED: scripts/demo.sh $*, scripts/deps.sh tests and the test build on a fresh Debian $release"
exit "$status"
