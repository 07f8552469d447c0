#!/usr/bin/env bash
# Installs the Debian packages the suite needs on this machine, those not installed yet.
#   scripts/deps.sh          everything the tests need (kernel tests, Go reference, runtimes)
#   scripts/deps.sh demo     what the demo needs
set -euo pipefail

# Only what is named here is installed (--no-install-recommends): following Recommends pulls a
# kernel image (wireguard-tools recommends wireguard-modules) whose install fails in a container.
# The demo builds the suite: gcc and libc6-dev are the linker (cc) and the C code of ring, the
# TLS crates' cryptography; protobuf-compiler the etcd client crate's build (it generates its
# gRPC code from etcd's .proto files with protoc), and libprotobuf-dev the well-known types
# those files import (google/protobuf/descriptor.proto, struct.proto); ca-certificates cargo's
# downloads. procps: sysctl in each node; the rest the namespaces, rules and pods it makes.
demo=(gcc libc6-dev protobuf-compiler libprotobuf-dev ca-certificates procps iptables nftables iproute2 util-linux socat busybox-static)
# conntrack/kmod: kernel tests; containernetworking-plugins: the Go reference plugins in
# /usr/lib/cni; podman/containerd/runc: the runtime end-to-end tests; etcd-server/etcd-client: the
# daemon's tests against a real etcd; protobuf-compiler (in the demo's list) also checks the CRI
# test's generated client (pkg/e2e/src/cri_api.rs); curl and openssl: the
# daemon's health endpoint and TLS tests; systemd: systemd-analyze verify of deploy/systemd's unit;
# iputils-ping: pings with DF set across vxlan (busybox's ping cannot set it); python3-kubernetes:
# the API server stand-in's fidelity test (pkg/testkit/tests/kube_api.rs) runs the Python client;
# wireguard-go and wireguard-tools: the userspace tunnel's interop tests pair it with Go's and
# configure both with `wg`; iperf3: the WireGuard throughput benchmark; tcpdump: the capture
# test showing only UDP on the underlay between wireguard nodes; mmdebstrap: the fresh Debian
# root filesystems of scripts/fresh-machine.sh and scripts/image.sh; bc: the WireGuard
# benchmark's arithmetic; ethtool: what an operator reads of the vxlan device's checksum offload,
# beside flanneld's own ioctl.
tests=("${demo[@]}" conntrack kmod containernetworking-plugins podman containerd runc etcd-server etcd-client curl openssl systemd iputils-ping python3-kubernetes wireguard-go wireguard-tools iperf3 bc tcpdump mmdebstrap ethtool)
# kubectl drives the same test; the machine image ships one at /usr/bin/kubectl, elsewhere Debian's
# kubernetes-client (its kubectl 1.20 has no `patch --subresource`, which that test uses).
command -v kubectl >/dev/null || tests+=(kubernetes-client)

case "${1:-tests}" in
    demo) wanted=("${demo[@]}") ;;
    tests) wanted=("${tests[@]}") ;;
    *) echo "usage: $0 [tests|demo]" >&2; exit 2 ;;
esac

missing=()
for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "missing packages: ${missing[*]}; run as root to install them" >&2
    exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Another apt run on the machine holds dpkg's lock for a while: wait for it rather than fail.
apt-get update -qq -o DPkg::Lock::Timeout=600
# dpkg's progress goes to a log, printed whole when the install fails: the reason is in it.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    echo "installing ${missing[*]} failed: apt's output is above" >&2
    exit 1
fi
