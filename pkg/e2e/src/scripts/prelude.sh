# Prelude of every session script. Runs as root inside the node's host network namespace and a
# fresh private mount namespace (nsenter --net + unshare --mount --propagation private), so every
# mount below is seen by this script and its children only. $WORK is the node's directory.
set -u
exec 2>&1

# step NAME CMD...: runs CMD (a program: at most 60 s; or a shell function) and reports
# "@@@ NAME <exit code>" then its output.
step() {
    local name=$1 out rc
    shift
    if declare -F "$1" >/dev/null; then
        out=$("$@" 2>&1)
    else
        out=$(timeout 60 "$@" 2>&1)
    fi
    rc=$?
    printf '@@@ %s %d\n%s\n' "$name" "$rc" "$out"
    return "$rc"
}

# pause: lets the test look at the node while the container runs; it answers on stdin.
pause() {
    echo '@@@ pause 0'
    read -r _ || exit 1
}

# graft SRC TARGET: shows SRC at TARGET without creating anything on the machine's filesystem.
# When TARGET is missing, its nearest existing ancestor is covered by a tmpfs into which the
# ancestor's entries are bound back, and TARGET is created in that tmpfs.
graft() {
    local src=$1 target=$2 anc=$2 keep e n
    while [ ! -e "$anc" ]; do anc=$(dirname "$anc"); done
    if [ "$anc" != "$target" ]; then
        keep=$(mktemp -d "$WORK/graft.XXXXXX")
        mount --rbind "$anc" "$keep"
        mount -t tmpfs -o mode=0755 tmpfs "$anc"
        for e in "$keep"/* "$keep"/.[!.]*; do
            [ -e "$e" ] || [ -L "$e" ] || continue
            n=$anc/${e##*/}
            if [ -L "$e" ]; then
                cp -P "$e" "$n"
            elif [ -d "$e" ]; then
                mkdir "$n" && mount --rbind "$e" "$n"
            else
                touch "$n" && mount --bind "$e" "$n"
            fi
        done
        mkdir -p "$target"
    fi
    mount --bind "$src" "$target"
}

# The node's view: runtime state under /run is private (a tmpfs), flanneld's subnet.env and the
# plugins' state under /var/lib/cni are the node's directories.
mount -t tmpfs -o mode=0755 tmpfs /run || exit 1
mkdir -p /run/flannel /run/netns
mount --bind "$WORK/run-flannel" /run/flannel || exit 1
graft "$WORK/var-lib-cni" /var/lib/cni || exit 1
