#!/usr/bin/env bash
# Runs the whole test suite: unit tests and kernel tests (as root, in throwaway namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "the kernel tests create network namespaces: run as root" >&2
    exit 1
fi
scripts/deps.sh tests
cargo build --workspace --bins --quiet
exec cargo nextest run --workspace --no-fail-fast --test-threads "${TEST_THREADS:-8}" "$@"
