#!/usr/bin/env bash
# Runs the whole test suite: unit tests and kernel tests (as root, in throwaway namespaces).
# A test that needs what this machine lacks passes without running and is listed at the end
# (testkit::runs_here): a kernel feature (no install provides one) everywhere; a package only
# outside CI, since with CI set (.ci/run sets it) deps.sh has installed it and a missing one
# fails the test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "the kernel tests create network namespaces: run as root" >&2
    exit 1
fi
scripts/deps.sh tests
# Every binary a test may exec, also of a package with no integration test, built with the
# dependencies' features the tests' build gives them (--tests turns the dev-dependencies on):
# without them (plain --bins) tokio and its dependents were built a second time, for nothing.
cargo build --workspace --bins --tests --quiet
skipped=$(mktemp)
trap 'rm -f "$skipped"' EXIT
status=0
TESTKIT_SKIP_LOG=$skipped cargo nextest run --workspace --no-fail-fast \
    --test-threads "${TEST_THREADS:-8}" "$@" || status=$?
if [ -s "$skipped" ]; then
    echo
    echo "SKIPPED: $(sort -u "$skipped" | wc -l) test(s) passed without running, for lack of:"
    sort -u "$skipped" | sed 's/^/  /'
fi
exit "$status"
