#!/usr/bin/env bash
# Fuzzing: `scripts/fuzz.sh [seconds | --runs N] [target...]` runs each cargo-fuzz target in
# fuzz/ (all of them by default) on its corpus (fuzz/corpus/<target>, grown from the committed
# seeds in fuzz/seeds/<target>), either for that many seconds (default 60) or until it has made
# N executions, then prints how many executions each made and how long that took. A crash,
# panic, abort or hang (an input running over 10 s) fails the run; libFuzzer saves the input in
# fuzz/artifacts/<target>/ (turn it into a unit test of the parser). libFuzzer's own output of
# the last run of each target stays in fuzz/logs/<target>.log.
#
# The targets are built without a sanitizer by default (FUZZ_SANITIZER=none): the parsers are
# safe Rust, where a panic, an abort or a hang is what there is to find, and AddressSanitizer
# would cost two to three times the executions. FUZZ_SANITIZER=address builds them with it.
# FUZZ_BUILD=dev builds them unoptimised (cargo fuzz --dev): half the build's CPU for a fraction
# of the executions, which is what CI's 20-second runs want; release (the default) for real runs.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
limit=(-max_total_time=60)
case "${1:-}" in
--runs)
    limit=(-runs="${2:?--runs needs a number of executions}")
    shift 2
    ;;
'' | *[!0-9]*) ;;
*)
    limit=(-max_total_time="$1")
    shift
    ;;
esac
sanitizer="${FUZZ_SANITIZER:-none}"
case "${FUZZ_BUILD:-release}" in
release) profile=(--release) ;;
dev) profile=(--dev) ;;
*) echo "FUZZ_BUILD is release or dev, not ${FUZZ_BUILD}" >&2; exit 2 ;;
esac

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
cargo +nightly fuzz build -s "$sanitizer" "${profile[@]}"

status=0
summary=""
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "seeds/$t" logs
    log="logs/$t.log"
    echo "== $t (${limit[*]})"
    # host_local_files writes every file of its input to disk on each execution, so its cost
    # grows with the input's length: 1 KiB holds a dozen reservation files and an index.
    extra=()
    [ "$t" = host_local_files ] && extra=(-max_len=1024)
    start=$(date +%s)
    if ! cargo +nightly fuzz run -s "$sanitizer" "${profile[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        "${limit[@]}" "${extra[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1; then
        status=1
        tail -n 40 "$log"
        summary+=$(printf '%-20s FAILED (see fuzz/artifacts/%s)' "$t" "$t")$'\n'
    else
        took=$(($(date +%s) - start))
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" || true)
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" || true)
        summary+=$(printf '%-20s %12s executions in %6s s (%s/s)' "$t" "$execs" "$took" "$rate")$'\n'
    fi
done
printf '\n%s' "$summary"
exit "$status"
